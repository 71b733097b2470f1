"""The error every validation step raises for an input that cannot become a record."""

__all__ = ["ImageRejected"]


class ImageRejected(Exception):
    """An input that cannot become a record, with a reason code.

    Attributes:
      reason: A key of `schemas.REJECT_REASONS`.
      message: A human-readable explanation.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
