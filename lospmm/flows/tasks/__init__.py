"""One thin adapter per stage (read inputs -> call the stage -> write the artifact -> manifest).

Each module's source, and every project module it imports, is that stage's code version
(`lospmm.flows.dag.stage_version`), so editing an adapter changes its stage's key and no other."""
