"""The SWE recipe: task rows, the test-graded reward and its guards, the task factory, and the
`swe` task family (registered when `conveyor.tasks.swe.family` is imported)."""
