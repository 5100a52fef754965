"""Transactional result folders: a result appears whole or not at all, and nothing of the user's is lost.

Every command that writes a result folder (``run``, ``compare``, ``sweep``, ``plan``, ``plot``) goes
through :class:`ResultDir`:

1. ``ResultDir(out, command)`` checks the path *before any work* (not a file, not a device, not under a
   file, its parent writable, and an existing folder empty or a dtsim result: one with a manifest) and
   takes an exclusive lock (``.NAME.lock`` beside the folder), so a second run into the same folder fails
   at once with one line instead of mixing files with the first (the lock file is removed when the run
   ends).
2. The command writes into ``staging``, a fresh hidden folder beside ``out`` (``.NAME.tmp-XXXXXXXX``).
3. ``commit()`` swaps it in by rename: the previous result becomes ``NAME.prev`` (the one before that is
   deleted once the new result is in place), then the files the user put into the folder themselves
   (anything its manifest does not list) move from ``NAME.prev`` into the new folder unchanged, and a
   manifest (``.dtsim-result.json``) records which files dtsim wrote. Signals are held off during the
   swap. If a rename fails (a mount point, a file the system will not move) every step is undone and one
   line says so; a user's file that cannot join the new result (its name is now an output's) stays in
   ``NAME.prev``, is named on stderr, and ``NAME.prev`` is then never deleted until it is moved away.
   ``plot`` into its own folder (``in_place``) replaces the charts file by file and never looks at or
   touches ``NAME.prev``; it refuses (before drawing, and again before replacing anything) when a file it
   would write is the user's (not in the manifest), and refuses a folder without a manifest outright;
   ``plot`` into another folder starts its staging folder from copies of the source result's files
   (``seed_files``), so the new result is whole: a folder ``dtsim plot`` can replot in turn.
4. On an error, Ctrl-C or SIGTERM the staging folder is removed, ``out`` is left as it was, and one line
   on stderr says so. A signal that arrives while the staging folder is being made, or while the result
   is being committed, is recorded and acted on when that step ends (before the swap: as above; during
   it: the new result is in place, and the command says so and still stops as interrupted).

A reader therefore sees the old result or the new one, never a mix; a crash (SIGKILL, power loss)
leaves at worst a hidden ``.NAME.tmp-XXXXXXXX`` folder holding only dtsim's files, removed by the next
run into the same folder. A user's file is never in such a folder: it moves only from one result folder
to the other. A folder without a manifest is never taken for a result (dtsim could not tell its files
from the user's), whatever its files are named.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from sim import __version__
from sim.errors import ScenarioError
from sim.paths import expand_path

MANIFEST = ".dtsim-result.json"
PREV_SUFFIX = ".prev"
# The names mkdtemp gives a staging folder (and a parked previous result) beside NAME: exactly eight
# characters after the prefix, so a user's own ``.NAME.tmp-backup`` is never taken for a leftover of ours.
_STAGING_TAIL = re.compile(r"^[a-z0-9_]{8}$")
# An atomic writer's temporary file (``sim.outputs.writers.atomic_text``) for a file the manifest lists.
_ATOMIC_TMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp$")
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Set once a ResultDir has told the user about an interruption (one line), so the command's own
# "interrupted" line is not printed after it.
interrupt_reported = False


def _err(msg: str, field: str = "--out") -> ScenarioError:
    return ScenarioError(msg, field)


# The longest file name most file systems take (NAME_MAX), and what the staging folder adds to NAME.
_NAME_MAX_BYTES = 255
_STAGING_EXTRA_BYTES = len("..tmp-") + 8


def _writable_dir(path: Path, field: str, target: Path | None = None) -> None:
    """Probe by creating (and removing) a file: permissions alone miss /proc, read-only mounts, full disks.
    ``target``: the path to be made under ``path`` (named in the message), if not ``path`` itself."""
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".dtsim-probe-")
    except OSError as exc:
        what = (f"{str(target)!r} cannot be made: its folder {str(path)!r} takes no new files"
                if target is not None and target != path else f"{str(path)!r} is not writable")
        raise _err(f"{what} ({exc.strerror}); choose a folder you can write to", field) from None
    os.close(fd)
    os.unlink(probe)


def existing_ancestor(path: Path, field: str = "--out") -> Path:
    """The nearest existing ancestor of ``path`` (which must be a writable folder, not a file)."""
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():  # dangling link
            raise _err(f"{str(parent)!r} is a broken symbolic link; fix it or choose another path", field)
        parent = parent.parent
    if not parent.is_dir():
        raise _err(f"{str(path)!r} lies under {str(parent)!r}, which is a file, not a folder; "
                   "choose a path under a folder", field)
    _writable_dir(parent, field, path)
    return parent


def check_output_file(path: str | os.PathLike, field: str, suffixes: tuple[str, ...] = ()) -> Path:
    """Check a single output file path before any work: a regular file or new, under a writable folder."""
    p = expand_path(path, field)
    if len(p.name.encode()) > _NAME_MAX_BYTES - len(".") - 9 - len(".tmp"):  # atomic_open's temporary name
        raise _err(f"the file name {p.name[:40]!r}… is {len(p.name.encode())} bytes long, too long for the file "
                   "system with dtsim's temporary-file suffix; choose a shorter name", field)
    if suffixes and p.suffix not in suffixes:
        raise _err(f"{str(p)!r} must end in {' or '.join(suffixes)}", field)
    if p.exists() or p.is_symlink():
        try:
            st = p.stat()
        except OSError as exc:
            raise _err(f"{str(p)!r} cannot be used ({exc.strerror}); choose another path", field) from None
        if stat.S_ISDIR(st.st_mode):
            raise _err(f"{str(p)!r} is a folder; give a file name inside it", field)
        if not stat.S_ISREG(st.st_mode):
            raise _err(f"{str(p)!r} is not a regular file (a device or pipe); give a file path", field)
    existing_ancestor(p, field)
    return p


def _is_dtsim_name(name: str, listed: set[str]) -> bool:
    if name == MANIFEST or name in listed:
        return True
    m = _ATOMIC_TMP.match(name)
    return bool(m and m.group("name") in listed)


def _manifest_files(folder: Path) -> set[str] | None:
    """The files dtsim wrote into ``folder`` (its manifest), or None when there is no readable manifest."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = data["files"]
        if not isinstance(files, dict):
            return None
        return {str(k) for k in files}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_result_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a dtsim result: a readable manifest. Files named as dtsim names its outputs
    do not make one (a user's own ``best.yaml`` or ``timeline.csv`` would then be replaced, then deleted)."""
    return _manifest_files(folder) is not None


def user_files(folder: Path) -> list[str]:
    """Entries of a result folder that dtsim did not write (the user's own); all of them without a manifest."""
    listed = _manifest_files(folder) or set()
    return sorted(n for n in os.listdir(folder) if not _is_dtsim_name(n, listed))


def result_files(folder: Path, fallback: tuple[str, ...] = ()) -> list[Path]:
    """dtsim's own files of a result folder, to carry into a new result: those its manifest lists (top
    level, regular, not hidden). Without a manifest (a folder from before manifests) only the names in
    ``fallback`` that are regular files there: anything else may be the user's."""
    listed = _manifest_files(folder)
    names = sorted(os.listdir(folder)) if listed is not None else [n for n in fallback if (folder / n).exists()]
    return [folder / n for n in names
            if n != MANIFEST and not n.startswith(".") and (listed is None or _is_dtsim_name(n, listed))
            and (folder / n).is_file()]


def _is_staging_leftover(path: Path, name: str) -> bool:
    """Whether ``path`` is a staging folder (or parked result) of an earlier run into NAME."""
    prefix = f".{name}.tmp-"
    return (path.name.startswith(prefix) and bool(_STAGING_TAIL.match(path.name[len(prefix):]))
            and path.is_dir() and not path.is_symlink())


class ResultDir:
    """One transactional write of a result folder; see the module docstring."""

    def __init__(self, out: str | os.PathLike, command: str, field: str = "--out", in_place: bool = False,
                 seed_files: Sequence[Path] = (), outputs: Collection[str] = ()):
        self.out = expand_path(out, field)
        self.command = command
        self.field = field
        # ``plot`` redrawing a result's charts in its own folder: staging starts from the result's files, and
        # the commit replaces them file by file (the folder is the same run: NAME.prev is left alone).
        self.in_place = in_place
        # Files of another result that staging starts from (copies, never links: the two folders must not
        # share a file a user may edit in place); the commit then swaps the folder in as usual.
        self.seed_files = list(seed_files)
        # ``in_place``: the names the command will write into the folder, checked against the user's files
        # before any work (the commit checks again, exactly, against what was drawn).
        self.outputs = set(outputs)
        self._check_name()  # before deriving names from it: '.' or '/' has none
        self.prev = self.out.with_name(self.out.name + PREV_SUFFIX)
        self.staging: Path | None = None
        self._lock_fd: int | None = None
        self._lock_path = self.out.parent / f".{self.out.name}.lock"
        self._old_handlers: dict[int, object] = {}
        # The signal that arrived while this folder was being written ("SIGINT"/"SIGTERM"), or None: a
        # KeyboardInterrupt raised again for it carries the name, so the exit status stays 130 or 143.
        self._signal: str | None = None
        # While set (making the staging folder, deciding, swapping, cleaning up), a SIGINT/SIGTERM is only
        # recorded in ``_signal`` and acted on when the step is done: no interrupt can land between
        # creating the staging folder and knowing its name, or between two renames of the swap.
        self._deferring = False
        self._old_unraisablehook: Callable[[Any], object] | None = None
        self._check()
        self._lock()

    # ---- checks (before any work) ------------------------------------------------------------------
    def _check_name(self) -> None:
        out = self.out
        if str(out) in ("", ".", "..", os.sep) or out.name in ("", ".", ".."):
            raise _err(f"{str(out)!r} is not a folder name dtsim can replace; give e.g. results/NAME", self.field)
        if len(out.name.encode()) + _STAGING_EXTRA_BYTES > _NAME_MAX_BYTES:
            raise _err(f"the folder name {out.name[:40]!r}… is {len(out.name.encode())} bytes long; dtsim's staging "
                       f"folder beside it adds {_STAGING_EXTRA_BYTES}, over the file system's {_NAME_MAX_BYTES}; "
                       "choose a shorter name", self.field)

    def _check(self) -> None:
        out, field = self.out, self.field
        if out.is_symlink():
            raise _err(f"{str(out)!r} is a symbolic link; give the real folder path", field)
        if out.exists():
            if not out.is_dir():
                kind = "a file" if out.is_file() else "not a folder (a device or pipe)"
                raise _err(f"{str(out)!r} is {kind}; give a folder path for the results", field)
            _writable_dir(out, field)
            try:
                entries = os.listdir(out)
            except OSError as exc:
                raise _err(f"{str(out)!r} cannot be listed ({exc.strerror}); choose another folder", field) from None
            if self.in_place:
                self._check_in_place()
            elif entries and not is_result_folder(out):
                raise _err(
                    f"{str(out)!r} already holds files and is not a dtsim result (it has no {MANIFEST} manifest, "
                    "so dtsim cannot tell its outputs from yours); give a new or empty folder, or move those "
                    "files away (dtsim replaces the folder it writes)",
                    field,
                )
        existing_ancestor(out, field)
        if self.in_place and out.is_dir():  # files replaced one by one in out: NAME.prev is left alone
            return
        if self.prev.exists() or self.prev.is_symlink():
            if self.prev.is_symlink() or not self.prev.is_dir() or (
                os.listdir(self.prev) and not is_result_folder(self.prev)
            ):
                raise _err(
                    f"{str(self.prev)!r} exists and is not a previous dtsim result (dtsim keeps the previous "
                    "result there); move it away",
                    field,
                )
            extra = user_files(self.prev)
            if extra:
                raise _err(
                    f"{str(self.prev)!r} (the previous result, replaced by this run) holds files dtsim did not "
                    f"write ({', '.join(extra[:3])}); move them away first",
                    field,
                )

    def _in_place_fix(self) -> str:
        return f"dtsim {self.command} {shlex.quote(str(self.out))} --out NEW"

    def _check_in_place(self) -> None:
        """``in_place`` into an existing folder: a dtsim result, and none of the names to be written the user's."""
        if not is_result_folder(self.out):
            raise _err(
                f"{str(self.out)!r} has no {MANIFEST} manifest (a result from an older dtsim, or not a dtsim "
                "result), so dtsim cannot tell its files from yours and will not redraw in it; draw into a new "
                f"folder instead, which gets the result's data files: {self._in_place_fix()}",
                self.field,
            )
        self._refuse_clashes(sorted(self.outputs), when="would write")

    def _refuse_clashes(self, names: Sequence[str], when: str) -> None:
        """One line when any of ``names`` in out is the user's (not in the manifest): never replaced."""
        mine = set(user_files(self.out))
        clash = [n for n in names if n in mine]
        if clash:
            shown = ", ".join(clash[:5]) + (f" and {len(clash) - 5} more" if len(clash) > 5 else "")
            raise _err(
                f"{str(self.out)!r} holds your own file(s) {shown} (not in its {MANIFEST} manifest), which "
                f"dtsim {self.command} {when}; nothing was changed; rename or move them away, or draw into "
                f"a new folder: {self._in_place_fix()}",
                self.field,
            )

    def _lock(self) -> None:
        parent = self.out.parent
        parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd, self._lock_path = take_lock(self.out, self.field)
        # Leftovers of a run killed outright (SIGKILL): ours to remove now that we hold the lock. They hold
        # only dtsim's files (a user's file moves from one result folder to the other, never through them).
        for stale in parent.glob(f".{glob_escape(self.out.name)}.tmp-*"):
            if _is_staging_leftover(stale, self.out.name):
                shutil.rmtree(stale, ignore_errors=True)

    # ---- the transaction ---------------------------------------------------------------------------
    def __enter__(self) -> Path:
        self._install_signals()
        self._deferring = True
        try:
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))
            os.chmod(self.staging, 0o777 & ~_umask())
            if self.in_place and self.out.is_dir():
                for src in result_files(self.out):
                    _link_or_copy(src, self.staging / src.name)
            for src in self.seed_files:
                try:
                    shutil.copy2(src, self.staging / src.name)
                except OSError as exc:
                    raise _err(f"{str(src)!r} could not be copied into the new result ({exc.strerror or exc}); "
                               f"{str(self.out)!r} is unchanged; make it readable and run again", self.field) from None
            if self._signal:  # asked to stop while the folder was being set up
                raise KeyboardInterrupt(self._signal)
        except BaseException as exc:  # no __exit__ will run: undo what was set up
            self._abort(interrupted=isinstance(exc, KeyboardInterrupt))
            self._restore_signals()
            self._unlock()
            raise
        finally:
            self._deferring = False
        return self.staging

    def __exit__(self, exc_type, exc, tb) -> None:
        self._deferring = True  # from here on the folder settles first, then a signal is acted on
        try:
            if exc_type is None and self._signal:
                # The KeyboardInterrupt fired inside a weakref callback or __del__ (a garbage collection),
                # where Python only reports and drops it: the user still asked to stop.
                self._abort(interrupted=True)
                raise KeyboardInterrupt(self._signal)
            if exc_type is None:
                self.commit()
                if self._signal:  # arrived during the swap: the new result is in place; stop as asked
                    print(f"dtsim: interrupted as the result was put in place; {str(self.out)!r} holds the new "
                          "result" + ("" if self.in_place else f" (the previous one is {self.prev.name})"),
                          file=sys.stderr)
                    _reported()
                    raise KeyboardInterrupt(self._signal)
            else:
                interrupted = bool(self._signal) or issubclass(exc_type, KeyboardInterrupt)
                self._abort(interrupted=interrupted)
                if interrupted and not issubclass(exc_type, KeyboardInterrupt):
                    # Ctrl-C landed in a library that turned it into another error (matplotlib can):
                    # it is still an interruption, not a dtsim bug.
                    raise KeyboardInterrupt(self._signal or "SIGINT") from exc
        finally:
            self._restore_signals()
            self._deferring = False
            self._unlock()

    def commit(self) -> None:
        """Swap the finished staging folder in (signals held off so the swap is never half done)."""
        staging = self.staging
        assert staging is not None
        try:
            self._write_manifest(staging)
            if self._signal:  # asked to stop before the swap (the signal waited for the manifest)
                raise KeyboardInterrupt(self._signal)
        except BaseException as exc:  # e.g. Ctrl-C before the swap: the staging folder goes, out is untouched
            self._abort(interrupted=isinstance(exc, KeyboardInterrupt))
            raise
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED_SIGNALS)
        try:
            _fsync_dir(staging)
            if self.in_place and self.out.is_dir():
                try:
                    self._replace_files(staging)
                except BaseException:
                    self._abort(interrupted=False)
                    raise
            else:
                self._swap(staging)
            self.staging = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _swap(self, staging: Path) -> None:
        """out → NAME.prev, staging → out, then the user's files from NAME.prev into out; the result before
        (the old NAME.prev) is parked under a staging name first and deleted only once all that worked."""
        out, prev = self.out, self.prev
        parked: Path | None = None
        rotated = emptied = False
        try:
            if out.exists() and not os.listdir(out):  # an empty folder: nothing of a previous result to keep
                os.rmdir(out)
                emptied = True
            if out.exists():
                if prev.exists():
                    extra = user_files(prev)
                    if extra:  # put there since the check (before the work): never delete it
                        raise _err(f"{str(prev)!r} (the previous result, replaced by this run) now holds files "
                                   f"dtsim did not write ({', '.join(extra[:3])}); move them away and run again",
                                   self.field)
                    parked = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
                    os.rename(prev, parked / prev.name)
                os.rename(out, prev)
                rotated = True
            os.rename(staging, out)
        except OSError as exc:
            undo_failed = self._undo_swap(rotated, parked, emptied)
            self._abort(interrupted=False)
            state = (f"the earlier result could not be put back, see {str(parked)!r}" if undo_failed
                     else "the earlier result is unchanged")
            raise _err(f"could not put the new result in place at {str(out)!r} ({exc.strerror or exc}; dtsim swaps "
                       f"whole folders by rename, which a mount point or a locked file refuses); {state}; choose "
                       "another folder", self.field) from None
        except BaseException:
            self._undo_swap(rotated, parked, emptied)
            self._abort(interrupted=False)
            raise
        stuck: list[str] = []
        if rotated:
            for name in user_files(prev):
                if (out / name).exists() or (out / name).is_symlink():
                    stuck.append(name)  # its name is now one of this run's outputs
                    continue
                try:
                    os.rename(prev / name, out / name)
                except OSError:
                    stuck.append(name)
        if parked is not None:
            shutil.rmtree(parked, ignore_errors=True)
        _fsync_dir(out.parent)
        if stuck:
            print(f"dtsim: note: your file(s) {', '.join(stuck[:5])} stayed in {str(prev)!r} (the name is now one "
                  f"of this run's outputs, or the file could not be moved); move them away before the next run "
                  f"into {str(out)!r}, which keeps {prev.name} until then", file=sys.stderr)

    def _undo_swap(self, rotated: bool, parked: Path | None, emptied: bool = False) -> bool:
        """Put the earlier result and the one before it back after a failed swap (and the empty folder the
        user gave, removed to make room); True if that failed too."""
        try:
            if rotated and not self.out.exists():
                os.rename(self.prev, self.out)
            if emptied and not self.out.exists():
                os.mkdir(self.out)
            if parked is not None:
                os.rename(parked / self.prev.name, self.prev)
                os.rmdir(parked)
        except OSError:
            return True
        return False

    def _replace_files(self, staging: Path) -> None:
        """``in_place``: each file of staging replaces its namesake in out (atomic per file), the manifest
        last; NAME.prev, the user's files and anything not redrawn stay as they are."""
        names = sorted(p.name for p in staging.iterdir() if p.name != MANIFEST)
        self._refuse_clashes(names, when="has just drawn")  # put there since the check: never replaced
        try:
            for name in names:
                os.replace(staging / name, self.out / name)
            os.replace(staging / MANIFEST, self.out / MANIFEST)
        except OSError as exc:
            try:  # the files already moved are dtsim's: the manifest must still say so
                os.replace(staging / MANIFEST, self.out / MANIFEST)
            except OSError:
                pass
            raise _err(f"could not replace the charts in {str(self.out)!r} ({exc.strerror or exc}); some may be "
                       "redrawn and some not; run the same command again", self.field) from None
        shutil.rmtree(staging, ignore_errors=True)
        _fsync_dir(self.out)

    def _write_manifest(self, staging: Path) -> None:
        files = {}
        for p in sorted(staging.rglob("*")):
            if p.is_file() and p.name != MANIFEST:
                files[str(p.relative_to(staging))] = p.stat().st_size
        text = json.dumps({"dtsim": __version__, "command": self.command, "files": files},
                          indent=1, sort_keys=True) + "\n"
        (staging / MANIFEST).write_text(text, encoding="utf-8")

    def _abort(self, interrupted: bool) -> None:
        staging, self.staging = self.staging, None
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
            if interrupted:
                where = f"{str(self.out)!r} is unchanged" if self.out.exists() else f"{str(self.out)!r} was not created"
                print(f"dtsim: interrupted; removed the unfinished result ({staging.name}); {where}",
                      file=sys.stderr)
                _reported()

    # ---- signals and lock --------------------------------------------------------------------------
    def _install_signals(self) -> None:
        def to_interrupt(signum, frame):  # SIGTERM unwinds like Ctrl-C, so cleanup runs
            self._signal = signal.Signals(signum).name  # remembered in case a library swallows the interrupt
            if self._deferring:  # inside a step that must finish first: acted on when it ends
                return
            raise KeyboardInterrupt(self._signal)

        previous_hook = sys.unraisablehook

        def quiet(unraisable) -> None:  # our own dropped interrupt: no traceback (__exit__ acts on it)
            if not (self._signal and isinstance(unraisable.exc_value, KeyboardInterrupt)):
                previous_hook(unraisable)

        try:
            for sig in _HANDLED_SIGNALS:
                self._old_handlers[sig] = signal.signal(sig, to_interrupt)
        except ValueError:  # not the main thread: leave signals alone
            return
        self._old_unraisablehook = previous_hook
        sys.unraisablehook = quiet

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._old_handlers.clear()
        if self._old_unraisablehook is not None:
            sys.unraisablehook = self._old_unraisablehook
            self._old_unraisablehook = None

    def _unlock(self) -> None:
        release_lock(self._lock_fd, self._lock_path)
        self._lock_fd = None


def take_lock(target: Path, field: str) -> tuple[int | None, Path]:
    """An exclusive lock on ``.NAME.lock`` beside ``target`` (the folder or file a command writes), taken at
    once or refused with one line naming ``field``: two dtsim writing the same path would mix their files.
    Returns the descriptor (None on a file system without locks: the write goes on unlocked) and the path."""
    import fcntl  # POSIX only: imported where the lock is taken, so the module loads everywhere

    lock = target.parent / f".{target.name}.lock"
    for _ in range(10):  # the holder removes the file on release: lock the file that is there now
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise _err(f"cannot create the lock file {str(lock)!r} ({exc.strerror}); choose another folder",
                       field) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return fd, lock  # a file system without locks (some network mounts): write unlocked
            os.close(fd)
            raise _err(
                f"another dtsim is writing {str(target)!r} right now (lock {lock.name} held); "
                f"wait for it to finish or choose another {field}",
                field,
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if same:
            return fd, lock
        os.close(fd)
    raise _err(f"could not lock {str(lock)!r}; try again", field)


def release_lock(fd: int | None, lock: Path) -> None:
    """Remove and release a lock of ``take_lock`` (removed while still held: a waiting opener re-checks
    the inode)."""
    if fd is None:
        return
    try:
        os.unlink(lock)
    except OSError:
        pass
    os.close(fd)


def _reported() -> None:
    global interrupt_reported
    interrupt_reported = True


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)
