"""Step kinds, one module each. Each module defines one `executor.StepSpec` subclass."""
