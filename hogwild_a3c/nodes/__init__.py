"""Several machines: who this node is (`node`), who may join (`membership`), and the syncer's
rounds."""
