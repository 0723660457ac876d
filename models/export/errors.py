"""The error types bundle loading raises (torch-free).

Messages name files by their names inside the bundle (``model.onnx``, an archive member),
never by the directory the bundle or its unpacked copy lives in: a server passes them to
its clients, and the caller knows (and can say) which bundle it asked for.
"""

from __future__ import annotations


class BundleError(ValueError):
    """A bundle is malformed, tampered with, unsafe, or disagrees with its reference.

    ``member`` names the archive member at fault, when there is one; ``field``, ``expected``
    and ``received`` the manifest field at fault, what it must be and what it is, when the
    error is about one field's value (a server reports them as they are).
    """

    def __init__(self, message: str, *, member: str | None = None, field: str | None = None,
                 expected: str | None = None, received: object = None):
        super().__init__(message)
        self.member = member
        self.field = field
        self.expected = expected
        self.received = received


class ArchiveLimitError(BundleError):
    """An archive would unpack to more than the caller's ``limit`` bytes."""

    def __init__(self, message: str, *, limit: int, member: str | None = None):
        super().__init__(message, member=member)
        self.limit = limit
