"""Two kinds of failure: the user's mistake (exit 2, one line) and the simulation's own (e.g. deadlock)."""


class ScenarioError(Exception):
    """Bad user input. The message is one line naming the field, the value, the rule and a fix."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class SimulationError(Exception):
    """The simulation itself could not complete (a deadlock, an inconsistent schedule)."""
