"""What can go wrong with a compile cache, one class per cause a user acts on differently."""

from __future__ import annotations


class CompileCacheError(Exception):
    """Base class: a compile cache operation could not be done as asked."""

    label = "cache-error"


class BadCacheTarget(CompileCacheError, ValueError):
    """The target URI is not one this module can use (unknown protocol, malformed bucket id)."""

    label = "bad-target"


class CompilerMismatch(CompileCacheError, ValueError):
    """The target names the cache prefix of another compiler version than the installed one."""

    label = "compiler-mismatch"


class CacheDisabled(CompileCacheError):
    """The installed stack has no usable compile cache (disabled, or no compiler installed)."""

    label = "cache-disabled"


class TargetUnavailable(CompileCacheError, OSError):
    """The target could not be read or written (unreachable, refused, missing bucket)."""

    label = "target-unavailable"


class LocalCacheError(CompileCacheError):
    """This machine's side of a transfer failed (a full disk, a quota, a file size limit,
    permissions): the local disk is at fault, not the target."""

    label = "local-disk"


class UnreadableLayout(BadCacheTarget):
    """The target holds files for this compiler, but in a layout its cache does not use (a
    PyTorch/XLA cache where a TorchNeuron one was expected): nothing there could be pulled."""

    label = "unreadable-layout"
