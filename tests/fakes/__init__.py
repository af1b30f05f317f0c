"""Local fakes of the GPU clouds' HTTP APIs, for contract tests of the adapters in providers/."""
