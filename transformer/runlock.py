"""One run per output folder: an exclusive lock on a file inside it, held while the run writes there.

The lock is `fcntl.flock` on `run.lock`. The operating system releases it when the process ends, however
it ends (a normal exit, an exception, Ctrl-C, kill -9), so a dead run never blocks `--resume`; the file
itself stays behind and means nothing once no process holds it. It records the PID of the holder, which
the refusal names. On a system without fcntl (Windows) there is no lock.
"""

import os
import time
from pathlib import Path

from .errors import RunLockedError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

LOCK_NAME = "run.lock"


class FolderLock:
    """An exclusive, non-blocking lock on a run folder: `acquire` takes it or raises, `release` gives it back.

    Parameters
    ----------
    folder : str or Path
        The run's folder; it must exist.
    """

    def __init__(self, folder):
        self.path = Path(folder) / LOCK_NAME
        self.fd = None

    def acquire(self) -> "FolderLock":
        """Take the lock and write this process's PID into the lock file.

        Raises
        ------
        RunLockedError
            If another process holds it; the message names the folder and that process.
        """
        if fcntl is None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(f"{self.path.parent} is in use by another run (process {self.holder()}); "
                                 "wait for it to end, or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def holder(self, wait_s=1.0) -> str:
        """The PID the lock file names; the holder writes it just after taking the lock, so wait a little."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                text = self.path.read_text().strip()
            except OSError:
                text = ""
            if text or time.monotonic() > deadline:
                return text or "unknown"
            time.sleep(0.01)

    def release(self):
        """Give the lock back (closing the file releases it); releasing twice does nothing."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
