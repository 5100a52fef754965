"""Run simulation jobs as Ray tasks (``--executor ray``): the same jobs and results as local processes.

Ray is optional; without it the user gets a one-line ScenarioError saying how to install it. With no
``--address`` a private local Ray instance is started for the run and stopped after it; with one
(``auto``, ``ray://host:10001``, ``host:6379``) the tasks go to that cluster, whose nodes need dtsim
installed (``pip install dtsim`` or the same virtual environment).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

from tqdm import tqdm

from sim.errors import ScenarioError

INSTALL_HINT = "install it with `pip install ray` (or `pip install 'ray[default]'` for a cluster)"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ScenarioError(
            f"--executor ray needs the ray package, which is not installed; {INSTALL_HINT}", "--executor"
        ) from None
    return ray


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT (or ray://HOST:PORT) nobody listens on: Ray itself retries for minutes."""
    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return  # not host:port; let Ray judge it
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ScenarioError(
            f"cannot reach Ray at {address!r} ({exc.strerror or exc}); check --address (e.g. auto, HOST:6379 "
            "or ray://HOST:10001) or omit it to start a local Ray",
            "--address",
        ) from None


def run_on_ray(
    fn: Callable[..., dict],
    jobs: Sequence[tuple],
    *,
    address: str | None = None,
    progress: bool = True,
    desc: str = "simulating (ray)",
    num_cpus: int | None = None,
) -> list[dict]:
    """``fn(*job)`` for each job as a Ray task; results in job order."""
    ray = _import_ray()
    if address:
        check_reachable(address)
    started = False
    if not ray.is_initialized():
        try:
            ray.init(
                address=address,
                num_cpus=num_cpus if address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"at {address!r}" if address else "locally"
            raise ScenarioError(
                f"cannot start or reach Ray {where}: {str(exc).splitlines()[0]}; check --address "
                "(e.g. auto, or ray://HOST:10001)",
                "--address",
            ) from None
        started = True
    try:
        task = ray.remote(fn)
        refs = [task.remote(*job) for job in jobs]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[dict | None] = [None] * len(refs)
        waiting = list(refs)
        with tqdm(total=len(refs), desc=desc, unit="run", disable=not progress, leave=False) as bar:
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1)
                for ref in done:
                    results[index[ref]] = ray.get(ref)
                    bar.update()
        return results  # type: ignore[return-value]
    finally:
        if started:
            ray.shutdown()
