"""An orchestrator plugin: a cell (``orch_example.cells``) and a task (``orch_example.tasks``)."""
