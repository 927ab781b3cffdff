"""Finding libdownpour and the program, and running the program's commands
in-process (docs/python.md, "How it works").

The commands run from libdownpour_cli.so, the program's own sources built as
a module beside libdownpour.so: `downpour.train` hands cmd_train the same
argv the shell would, so the options are parsed, bounded and refused by the
one table in src/cli/cmd_train.c.  What the command writes on stdout and
stderr is captured (for the error messages and the results) and forwarded
as it comes (the step lines: progress in a terminal or a notebook)."""
import ctypes
import os
import shutil
import sys
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()  # one command at a time: fds 1 and 2 are the process's
_libs = None


class Error(Exception):
    """A downpour error: `message` is downpour's own, `argument` the keyword
    (or the option, without its dashes, underscores for dashes) it names,
    when it names one; `status` the command's exit status (2: a usage
    error, 1: a failed run)."""

    def __init__(self, message, argument=None, status=None):
        super().__init__(message)
        self.message = message
        self.argument = argument
        self.status = status


def _installed_dirs():
    """The installed package's libdir and bindir (_paths.py, written by cmake
    --install), or (None, None) in a source tree."""
    try:
        from . import _paths
    except ImportError:
        return None, None
    return (os.path.normpath(os.path.join(_HERE, _paths.LIBDIR)),
            os.path.normpath(os.path.join(_HERE, _paths.BINDIR)))


def _build_dir():
    """The build tree: $DOWNPOUR_BUILD, else build/ of the source tree this
    package sits in (python/downpour)."""
    d = os.environ.get("DOWNPOUR_BUILD")
    if d:
        return d
    return os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build")


def library_path():
    """libdownpour.so: $DOWNPOUR_LIB (the file, or its folder), then the
    build tree, then the installed libdir, then the linker's search path."""
    env = os.environ.get("DOWNPOUR_LIB")
    if env:
        p = os.path.join(env, "libdownpour.so") if os.path.isdir(env) else env
        if not os.path.exists(p):
            raise Error(f"DOWNPOUR_LIB={env}: no such library")
        return p
    libdir, _ = _installed_dirs()
    for d in ([libdir] if libdir else []) + [_build_dir()]:
        p = os.path.join(d, "libdownpour.so")
        if os.path.exists(p):
            return p
    import ctypes.util
    p = ctypes.util.find_library("downpour")
    if p:
        return p
    raise Error("libdownpour.so not found: build it (cmake --build build), set DOWNPOUR_LIB "
                "to it, or install downpour (docs/python.md)")


def program_path():
    """The downpour program: $DOWNPOUR_BIN, beside the library (a build
    tree), the installed bindir, then PATH."""
    env = os.environ.get("DOWNPOUR_BIN")
    if env:
        return env
    cands = []
    try:
        cands.append(os.path.join(os.path.dirname(os.path.abspath(library_path())), "downpour"))
    except Error:
        pass
    _, bindir = _installed_dirs()
    if bindir:
        cands.append(os.path.join(bindir, "downpour"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    p = shutil.which("downpour")
    if p:
        return p
    raise Error("the downpour program was not found beside libdownpour.so nor on PATH "
                "(set DOWNPOUR_BIN)")


def libs():
    """(libdownpour, libdownpour_cli), loaded once."""
    global _libs
    if _libs is None:
        path = os.path.abspath(library_path()) if os.path.sep in library_path() \
            else library_path()
        core = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        cli_path = os.path.join(os.path.dirname(path), "libdownpour_cli.so")
        if not os.path.exists(cli_path):
            raise Error(f"{cli_path} not found: it is built and installed beside "
                        f"libdownpour.so (cmake --build build --target downpour_cli)")
        cli = ctypes.CDLL(cli_path)
        for name in ("cmd_train", "cmd_eval"):
            f = getattr(cli, name)
            f.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            f.restype = ctypes.c_int
        _libs = (core, cli)
    return _libs


class _Tee:
    """Redirects fd `fd` to a pipe while active; a thread collects what
    comes and forwards it (to the original fd, or to the Python stream when
    that is not the fd itself: a notebook's)."""

    def __init__(self, fd, stream, echo):
        self.fd, self.stream, self.echo = fd, stream, echo
        self.chunks = []

    def __enter__(self):
        try:
            self.stream.flush()
        except Exception:
            pass
        self.saved = os.dup(self.fd)
        r, w = os.pipe()
        os.dup2(w, self.fd)
        os.close(w)
        self.r = r
        try:
            direct = self.stream.fileno() == self.fd
        except Exception:
            direct = False
        self.thread = threading.Thread(target=self._pump, args=(direct,), daemon=True)
        self.thread.start()
        return self

    def _pump(self, direct):
        while True:
            b = os.read(self.r, 65536)
            if not b:
                break
            self.chunks.append(b)
            if self.echo:
                if direct:
                    os.write(self.saved, b)
                else:
                    try:
                        self.stream.write(b.decode("utf-8", "replace"))
                        self.stream.flush()
                    except Exception:
                        pass

    def __exit__(self, *exc):
        os.dup2(self.saved, self.fd)  # closes the pipe's write end: the pump ends
        self.thread.join()
        os.close(self.r)
        os.close(self.saved)
        return False

    def text(self):
        return b"".join(self.chunks).decode("utf-8", "replace")


def run_command(name, args, echo=True):
    """Runs `downpour NAME ARGS...` in this process: (status, stdout, stderr)."""
    _, cli = libs()
    fn = getattr(cli, "cmd_" + name)
    argv = [name] + [str(a) for a in args]
    arr = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    libc = ctypes.CDLL(None)
    with _lock:
        with _Tee(1, sys.stdout, echo) as out, _Tee(2, sys.stderr, echo) as err:
            try:
                rc = fn(len(argv), arr)
            finally:
                libc.fflush(None)
    return rc, out.text(), err.text()
