"""Result files: summary.json, timeline.csv, trace.json (Chrome/Perfetto), resolved.yaml.

All writes are atomic (temp file in the same folder, then rename), so an interrupted run never leaves
a half-written file where a good one was.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import repeat
from json import encoder as je
from pathlib import Path
from typing import IO, Any

import numpy as np

from sim.engine.span_table import span_table
from sim.engine.timeline import CounterSample, Timeline


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path``; on success rename it over ``path``, on error remove it.

    Readers never see a half-written file, and an interrupted write leaves the old file in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before it replaces the old file
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


@contextmanager
def atomic_text(path: Path, gzip_level: int | None = None) -> Iterator[IO[str]]:
    """A text stream to ``path``, written atomically; gzip-compressed when ``gzip_level`` is given.

    The gzip header carries no file name and no time, so the same run gives the same bytes."""
    if gzip_level is None:
        with atomic_open(path, "w") as f:
            yield f
        return
    with atomic_open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=gzip_level, mtime=0) as gz:
            with io.TextIOWrapper(gz, encoding="utf-8", newline="") as text:
                yield text


def summary_json(summary: Mapping[str, Any]) -> str:
    """Stable text: sorted keys, so the same scenario and seed give byte-identical files."""
    return json.dumps(dict(summary), indent=2, sort_keys=True, allow_nan=False, default=float) + "\n"


CSV_HEADER = "gpu,stream,name,category,start_s,dur_s,end_s,microbatch,bytes\n"
CHUNK_LINES = 50_000  # lines joined per write: bounded memory for any timeline size


def _csv_quote(text: str) -> str:
    """A CSV field as ``csv.writer`` (QUOTE_MINIMAL) writes it."""
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv_column(texts: list[str]) -> list[str]:
    """Text fields quoted as ``csv.writer`` would; one scan of the joined column when none needs it."""
    joined = "\x00".join(texts)
    if not any(c in joined for c in ',"\n\r'):
        return texts
    return [_csv_quote(t) for t in texts]


def _csv_rows(table) -> np.ndarray:
    """Span indices sorted by (GPU, start, stream name), stable: the row order of timeline.csv."""
    if not len(table):
        return np.zeros(0, dtype=np.int64)
    alpha = {name: rank for rank, name in enumerate(sorted(table.streams))}
    stream_rank = np.array([alpha[name] for name in table.streams], dtype=np.int64)
    return np.lexsort((stream_rank[table.stream], table.start_s, table.gpu))


def _reprs(values: list) -> list[str]:
    """``repr`` of every number, formatted by the C list repr in one call (ints and finite floats only)."""
    text = repr(values)
    return text[1:-1].split(", ") if len(values) else []


def _each_distinct_once(values: np.ndarray, fmt: Callable[[list], list[str]]) -> list[str]:
    """``fmt`` of a finite numeric column, each distinct value formatted once when most repeat (durations:
    every micro-batch runs the same kernels, so 10⁵ spans hold a few thousand distinct lengths, and
    formatting is the costly part of the text files)."""
    if len(values) >= 1024 and not np.signbit(values).any():  # -0.0 and 0.0 would share one text
        uniq, inverse = np.unique(values, return_inverse=True)
        if 2 * len(uniq) <= len(values):
            return np.array(fmt(uniq.tolist()), dtype=object)[inverse.reshape(-1)].tolist()
    return fmt(values.tolist())


def _reprs_column(values: np.ndarray) -> list[str]:
    """``_reprs`` of a numeric column (``_each_distinct_once`` where every value is finite)."""
    if not np.isfinite(values).all():
        return _reprs(values.tolist())
    return _each_distinct_once(values, _reprs)


TRACE_TIME_DECIMALS = 3  # trace.json times in µs to the nanosecond (Perfetto shows ns at most)


def _micros(seconds: np.ndarray) -> list[str]:
    """Times in µs as trace.json writes them: fixed-point to the nanosecond, formatted by one C ``%``
    over the whole column (about 2.5× faster than the shortest round-trip repr timeline.csv keeps);
    a non-finite time (never produced by the simulator) as the JSON encoder writes it."""
    micros = seconds * 1e6
    if not len(micros):
        return []
    if not np.isfinite(micros).all():
        return [f"{v:.{TRACE_TIME_DECIMALS}f}" if math.isfinite(v) else json.dumps(v) for v in micros.tolist()]
    return _each_distinct_once(micros, _fixed_point)


def _fixed_point(values: list) -> list[str]:
    """Every value to ``TRACE_TIME_DECIMALS`` decimals, by one C ``%`` over the list."""
    return (f"%.{TRACE_TIME_DECIMALS}f," * len(values) % tuple(values)).split(",")[:-1]


def _coded(codes: np.ndarray, names: tuple[str, ...]) -> list[str]:
    """The CSV text of a coded string column: each distinct name quoted once, then looked up."""
    texts = np.array([_csv_quote(n) for n in names] or [""], dtype=object)
    return texts[codes].tolist()


def write_timeline_csv(timeline: Timeline, fh: IO[str]) -> None:
    """timeline.csv, streamed in chunks: one row per span, sorted by GPU, start and stream.

    The same bytes ``csv.writer`` gives, at a fraction of the cost: the numeric and coded columns come
    from the span table (numpy, shared with the charts and the trace), numbers are formatted column-wise
    by C list reprs, and rows are joined with ``map`` rather than one Python call per field; only the
    name and the args are read span by span."""
    spans = timeline.spans
    table = span_table(timeline)
    order = _csv_rows(table)
    fh.write(CSV_HEADER)
    for lo in range(0, len(order), CHUNK_LINES):
        rows = order[lo : lo + CHUNK_LINES]
        part = [spans[k] for k in rows.tolist()]
        starts, durs = table.start_s[rows], table.dur_s[rows]
        args = [s.args for s in part]
        mbs = [a.get("microbatch", "") for a in args]
        nbytes = [a.get("bytes", "") for a in args]
        cols = (
            _reprs(table.gpu[rows].tolist()),
            _coded(table.stream[rows], table.streams),
            _csv_column([s.name for s in part]),
            _coded(table.category[rows], table.categories),
            _reprs(starts.tolist()),
            _reprs_column(durs),
            _reprs((starts + durs).tolist()),
            ["" if v is None else str(v) for v in mbs],
            ["" if v is None else str(v) for v in nbytes],
        )
        fh.write("\n".join(map(",".join, zip(*cols, strict=True))) + "\n")


def timeline_csv(timeline: Timeline) -> str:
    buf = io.StringIO()
    write_timeline_csv(timeline, buf)
    return buf.getvalue()


STREAM_ORDER = {"compute": 0, "comm": 1, "dp": 2, "p2p": 3}


def _compact_encoder():
    """``json.dumps(o, separators=(",", ":"), default=float)`` without building an encoder per call: the
    C encoder made once (times are finite, so a float's JSON is its repr, as json itself writes it)."""
    make = getattr(je, "c_make_encoder", None)  # the C accelerator (absent from the type stubs)
    if make is None:  # pure-Python json: slower, same text
        return json.JSONEncoder(separators=(",", ":"), default=float).encode
    c_enc = make(None, float, je.encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda o: "".join(c_enc(o, 0))


def _json_strings(enc, texts: list[str]) -> list[str]:
    """The JSON of every string of ``texts``: one encoder call for the list, split at its separators. An
    escaped quote inside a text can fake a separator; then the split yields too many parts, and each text is
    encoded on its own instead."""
    if not texts:
        return []
    parts = enc(texts)[2:-2].split('","')
    if len(parts) != len(texts):
        return list(map(enc, texts))
    return list(map('"{}"'.format, parts))


def _threads(table) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
    """The trace's threads, one (first span, GPU, tid, stream code) per (GPU, stream) in the order the spans
    first show it (a known stream keeps its fixed tid, any other gets 10 + how many came before), and the
    index in that list of every span's thread."""
    width = max(len(table.streams), 1)
    key = table.gpu * width + table.stream
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    seen = np.argsort(first, kind="stable")  # unique keys in order of appearance
    threads = []
    for n, u in enumerate(seen.tolist()):
        gpu, stream = divmod(int(uniq[u]), width)
        threads.append((int(first[u]), gpu, STREAM_ORDER.get(table.streams[stream], 10 + n), stream))
    position = np.empty(len(uniq), dtype=np.int64)
    position[seen] = np.arange(len(uniq))
    return threads, position[inverse.reshape(-1)]


def _unit_name(name: str) -> str:
    """A counter track named in the unit the trace shows it in (``*_bytes`` → ``*_GB``)."""
    return name[: -len("_bytes")] + "_GB" if name.endswith("_bytes") else name


def _counter_events(enc, counters: list[CounterSample]) -> list[str]:
    """The "C" events of the counter tracks (memory over time), formatted column-wise like the spans."""
    if not counters:
        return []
    gpus = [c.gpu for c in counters]
    ts = [float(c.t_s) * 1e6 for c in counters]
    gb = [float(c.value) / 1e9 for c in counters]
    if not ({type(g) for g in gpus} <= {int} and np.isfinite(ts).all() and np.isfinite(gb).all()):
        return [enc({"ph": "C", "pid": c.gpu, "name": _unit_name(c.name), "ts": t, "args": {"GB": v}})
                for c, t, v in zip(counters, ts, gb, strict=True)]  # the encoder's own text for inf and nan
    names = {n: enc(_unit_name(n)) for n in {c.name for c in counters}}
    return list(map("".join, zip(repeat('{"ph":"C","pid":'), _reprs(gpus), repeat(',"name":'),
                                 [names[c.name] for c in counters], repeat(',"ts":'), _reprs(ts),
                                 repeat(',"args":{"GB":'), _reprs(gb), repeat("}}"))))


def write_chrome_trace(timeline: Timeline, fh: IO[str], meta: dict | None = None) -> None:
    """Chrome trace event format (JSON object form), streamed: pid = GPU, tid = stream, times in µs to the
    nanosecond (``_micros``; timeline.csv keeps every time exactly).

    Memory counter tracks use "C" events; process and thread names come from the timeline labels. Events
    are built a chunk of spans at a time, column by column: span times from the span table through one C
    ``%`` format per column, pid/tid and category texts once per distinct value, names in one encoder call, args once per
    distinct set, and each event joined from its pieces in C, so a 10⁶-span trace never exists as one list
    of dicts and no Python code runs per field."""
    enc = _compact_encoder()
    table = span_table(timeline)

    out: list[str] = []
    for g in timeline.gpus:
        out.append(enc({"ph": "M", "pid": g, "name": "process_name", "args": {"name": timeline.labels.get(g, f"gpu{g}")}}))
        out.append(enc({"ph": "M", "pid": g, "name": "process_sort_index", "args": {"sort_index": g}}))
    fh.write('{"traceEvents":[')
    first = True

    def flush() -> None:
        nonlocal first
        if out:
            fh.write(("" if first else ",") + ",".join(out))
            first = False
            out.clear()

    args_json: dict[tuple, str] = {}
    # The spans of one schedule action share one args dict: looked up by identity first (the spans, alive
    # throughout, keep every id taken here unique), by content on a miss.
    args_by_id: dict[int, str] = {}

    def args_text(args: dict) -> str:
        hit = args_by_id.get(id(args))
        if hit is not None:
            return hit
        try:
            key = tuple(args.items())
            hit = args_json.get(key)
        except TypeError:  # an unhashable value: encode it every time
            return enc(args)
        if hit is None:
            hit = args_json[key] = enc(args)
        args_by_id[id(args)] = hit
        return hit

    threads, thread_of = _threads(table)
    pid_tid = np.array([f'{{"ph":"X","pid":{gpu},"tid":{tid},"name":' for _, gpu, tid, _ in threads] or [""],
                       dtype=object)
    category = np.array([f',"cat":{enc(c)},"ts":' for c in table.categories] or [""], dtype=object)
    spans = timeline.spans
    thread = 0
    for lo in range(0, len(spans), CHUNK_LINES):
        hi = min(lo + CHUNK_LINES, len(spans))
        part = spans[lo:hi]
        while thread < len(threads) and threads[thread][0] < hi:
            # thread names are metadata: Perfetto reads them wherever they stand in the file
            _, gpu, tid, stream = threads[thread]
            out.append(f'{{"ph":"M","pid":{gpu},"tid":{tid},"name":"thread_name","args":{{"name":{enc(table.streams[stream])}}}}}')
            thread += 1
        out.extend(map("".join, zip(
            pid_tid[thread_of[lo:hi]].tolist(),
            _json_strings(enc, [s.name for s in part]),
            category[table.category[lo:hi]].tolist(),
            _micros(table.start_s[lo:hi]),
            repeat(',"dur":'),
            _micros(table.dur_s[lo:hi]),
            repeat(',"args":'),
            [args_text(s.args) for s in part],
            repeat("}"),
        )))
        flush()
    out.extend(_counter_events(enc, timeline.counters))
    flush()
    fh.write(f'],"displayTimeUnit":"ms","otherData":{enc(meta or {})}}}')


def chrome_trace(timeline: Timeline, meta: dict | None = None) -> str:
    """The Chrome trace as one string (see ``write_chrome_trace``)."""
    buf = io.StringIO()
    write_chrome_trace(timeline, buf, meta)
    return buf.getvalue()
