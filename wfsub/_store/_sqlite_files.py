"""The SQLite store's files: checks before SQLite sees a path, private creation (0600), the owner lock, and
SQLite errors turned into StoreErrors that say what to do.

Permissions. The store creates the database file itself with `os.open(O_CREAT | O_EXCL, 0o600)` before SQLite
opens it. SQLite's unix VFS creates the `-wal` and `-shm` files with the permission bits of the database file
(os_unix.c `findCreateFileMode`, then `fchmod` to exactly those bits, so the process umask does not widen
them), each time it recreates them. So the three files are 0600 without touching the umask: the umask is
per process, and changing it around an open would race with every other thread creating files at that
moment. A file that already existed keeps the mode its creator gave it (the store does not chmod a file it did
not create). The lock file is created 0600 the same way.

Ownership. `open(owner=True)` takes `flock(LOCK_EX | LOCK_NB)` on `FILE-lock` beside the database and holds it
until `close()`. flock locks belong to an open file description, so a second store object in the same process
is refused as surely as another process, and the kernel drops the lock when the process dies, however it
dies: no stale lock to clean up. The lock file is never deleted (deleting it would let two processes lock two
different files of the same name).
"""

from __future__ import annotations

import os
import stat
import time

from .._errors import StoreError

LOCK_SUFFIX = "-lock"
SETTLE = 0.1  # seconds `acquire` retries a held lock: long enough for a `held()` check to let go


def check_path(path: str) -> None:
    """Refuse, before SQLite sees it, a path whose directory is missing or that names a directory."""
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise StoreError(
            path,
            f"cannot open the store: its directory {parent} {what}; create it first (mkdir -p {parent}) or "
            "give a path in an existing directory",
        )
    if os.path.isdir(path):
        raise StoreError(
            path, "cannot open the store: this path is a directory; give the path of a file inside it, e.g. "
            f"{os.path.join(path, 'wfsub.db')}"
        )


def create_private(path: str) -> bool:
    """Create the file empty with mode 0600 unless it exists; True if this call created it."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        raise StoreError(
            path,
            f"cannot create the store file: {exc.strerror}; the directory must be writable by this process "
            f"(uid {os.getuid()}): make it writable or choose another directory",
        ) from exc
    os.close(fd)
    return True


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class OwnerLock:
    """An exclusive `flock` on `FILE-lock`, held from `acquire()` to `release()` (the OS drops it if we die)."""

    def __init__(self, path: str) -> None:
        self.path = path + LOCK_SUFFIX
        self._fd: int | None = None

    def held(self) -> bool:
        """Whether someone holds the lock now: a shared lock taken and dropped at once, so an owner opening in
        that instant waits (`acquire` retries for `SETTLE` seconds) instead of being refused."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # never owned
        except OSError as exc:
            raise StoreError(self.path, f"cannot read the owner lock file: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock if it was taken
        return False

    def acquire(self) -> bool:
        """Take the lock; False if another open file description holds it (another process or store object)."""
        try:
            import fcntl
        except ImportError as exc:  # not POSIX
            raise StoreError(
                self.path, "cannot take ownership: this platform has no fcntl.flock; run the owning Substrate on "
                "Linux or macOS"
            ) from exc
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(
                self.path,
                f"cannot create the owner lock file: {exc.strerror}; the store's directory must be writable by "
                "the owning Substrate",
            ) from exc
        deadline = time.monotonic() + SETTLE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.005)  # a `held()` check holds the lock shared for microseconds
            except OSError as exc:
                os.close(fd)
                raise StoreError(
                    self.path, f"cannot lock the owner lock file: {exc.strerror}; the file system must support flock"
                ) from exc
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


_FIXES = {
    "SQLITE_NOTADB": "it is not a SQLite database (or it is encrypted, or its first page is damaged): point the "
    "store at a new path, or restore the file from a backup",
    "SQLITE_CORRUPT": "the file is damaged: restore it from a backup (`sqlite3 {file} .recover` salvages what is "
    "still readable into a new file)",
    "SQLITE_READONLY_DIRECTORY": "its directory {dir} is read-only for this process: SQLite creates {file}-wal and "
    "{file}-shm there, so make the directory writable (chmod u+w {dir}), or run as the user that owns it",
    "SQLITE_READONLY": "the file or its directory is read-only for this process: SQLite writes the file and "
    "creates {file}-wal and {file}-shm beside it, so the file and its directory must both be writable (chmod u+w), "
    "or run as the user that owns them",
    "SQLITE_CANTOPEN": "SQLite could not open the file or create {file}-wal and {file}-shm beside it: the directory "
    "must exist and be writable by this process (chmod u+w {dir}), and the file readable and writable",
    "SQLITE_FULL": "the disk is full or the process reached its file size limit (ulimit -f): free space or raise "
    "the limit. The transaction was rolled back: none of its writes were kept",
    "SQLITE_IOERR": "an I/O error: the disk may be full, the process may have reached its file size limit "
    "(ulimit -f), or the device is failing; check `df` and the system log. The transaction was rolled back: "
    "none of its writes were kept",
    "SQLITE_BUSY": "another process held a lock on the file for longer than the busy timeout (10 s): find it "
    "with `fuser {file}` and let it finish, or stop it",
    "SQLITE_LOCKED": "a lock inside this process conflicts: report it as a wfsub bug",
    "SQLITE_PERM": "the operating system refused access: check the file's and the directory's permissions",
    "SQLITE_NOMEM": "SQLite ran out of memory: free memory and retry",
}


def fault(path: str, action: str, exc: BaseException) -> StoreError:
    """A StoreError for a driver error: what was attempted, the driver's words, and the fix (exc is the cause)."""
    name = getattr(exc, "sqlite_errorname", None)
    fix = None
    if isinstance(name, str):
        fix = _FIXES.get(name) or _FIXES.get("_".join(name.split("_")[:2]))
    if fix is None:
        text = str(exc).lower()
        if "not a database" in text:
            fix = _FIXES["SQLITE_NOTADB"]
        elif "malformed" in text:
            fix = _FIXES["SQLITE_CORRUPT"]
        elif "readonly" in text or "read-only" in text:
            fix = _FIXES["SQLITE_READONLY"]
        else:
            fix = "the driver's error is the cause below"
    fix = fix.format(file=path, dir=os.path.dirname(path) or ".")
    detail = f"{exc} ({name})" if name else f"{exc}"
    error = StoreError(path, f"{action} failed: {detail}; {fix}")
    error.__cause__ = exc
    return error
