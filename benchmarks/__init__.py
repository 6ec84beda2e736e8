"""Scripts that measure the project and write its results pages (docs/results/), each run by hand:
`python benchmarks/<name>.py`. Installed with the project (pyproject.toml) so that they import each other as
`benchmarks.<name>`."""
