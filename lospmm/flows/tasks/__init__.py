"""One thin adapter per stage (read inputs -> call the stage -> write the artifact -> manifest),
with the stage's artifact SCHEMA and the converters between its rows and stage records.

A stage's code version (`lospmm.flows.dag.stage_version`) is its adapter module and every lospmm
module that imports, transitively. Editing an adapter changes its own stage's key and the keys of
the stages downstream that read its artifact through its converters; never a stage upstream."""
