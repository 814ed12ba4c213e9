"""A private Postgres server for the chaos campaign: its own data directory, its own port, its own processes.

The campaign restarts and crashes its server, which it must never do to the machine's shared one (5432): so it
runs `initdb` into a temporary directory and starts `postgres` there on a free loopback port. Postgres refuses to
run as root, so when the campaign runs as root the server runs as the `postgres` OS user (the directory is handed
to it); otherwise as the current user.

    server = PrivateServer.start(workdir)     # initdb + start; server.dsn names database `chaos`
    server.crash()                            # stop -m immediate (no shutdown checkpoint): a crash as clients see it
    server.start_again()
    server.stop()                             # and the directory is left for the caller to remove

fsync is off: the campaign crashes the server process, never the machine, and what a committed transaction wrote
is in the kernel's page cache either way, so a server crash loses nothing a client was told was committed.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path


class ServerUnavailable(RuntimeError):
    """No Postgres server binaries on this machine (initdb, pg_ctl)."""


def binaries() -> Path:
    """The directory of initdb and pg_ctl: `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2].split(".")[0]))
    for d in reversed(dirs):
        if (Path(d) / "initdb").exists():
            return Path(d)
    raise ServerUnavailable(
        "the chaos campaign starts a Postgres server of its own and needs initdb and pg_ctl: install the "
        "postgresql package (Debian: apt-get install postgresql) or put pg_config on PATH"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateServer:
    def __init__(self, directory: Path, port: int, user: str | None) -> None:
        self.directory = directory
        self.port = port
        self.user = user  # the OS user the server runs as (None: this process's)
        self.bin = binaries()
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/chaos"
        self.admin_dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @classmethod
    def start(cls, workdir: Path) -> PrivateServer:
        user = "postgres" if os.geteuid() == 0 else None
        directory = workdir / "pgdata"
        directory.mkdir(parents=True)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(workdir, entry.pw_uid, entry.pw_gid)  # so the server can write its log beside the data
            os.chown(directory, entry.pw_uid, entry.pw_gid)
        server = cls(directory, free_port(), user)
        server._run("initdb", "-D", str(directory), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
        server.start_again()
        server.psql("CREATE DATABASE chaos")
        return server

    def _command(self, tool: str, *args: str) -> list[str]:
        cmd = [str(self.bin / tool), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return cmd

    def _run(self, tool: str, *args: str) -> str:
        done = subprocess.run(self._command(tool, *args), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done.stdout

    def start_again(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -c fsync=off "
            "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB"
        )
        self._run("pg_ctl", "-D", str(self.directory), "-l", str(self.directory / "server.log"), "-o", options,
                  "-w", "-t", "60", "start")

    def crash(self) -> None:
        """Stop at once, as a crash: clients lose their connections and whatever was not committed."""
        self._run("pg_ctl", "-D", str(self.directory), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        subprocess.run(self._command("pg_ctl", "-D", str(self.directory), "-m", "fast", "-w", "stop"),
                       capture_output=True, check=False)

    def psql(self, sql: str, database: str = "postgres") -> str:
        return self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database,
                         "-v", "ON_ERROR_STOP=1", "-Atc", sql)
