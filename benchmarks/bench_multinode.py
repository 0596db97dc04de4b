"""Two nodes sharing only a bucket vs one node: wall time of the same run, and its ratio.

One spec (a small MLP, 8 -> 64 -> 2, SGD, 16 samples per rank and step, DDP over gloo on
the CPU, one thread per rank; a checkpoint every 20 steps and at the end into a bucket on
a local moto S3 server; ``--epochs`` epochs of 2,048 samples) runs as

* **1 node x 2 processes** - ``torchrun --standalone --nproc-per-node 2``;
* **2 nodes x 1 process** - two ``torchrun --nnodes 2 --node-rank R --rdzv-backend c10d
  --rdzv-endpoint 127.0.0.1:PORT --local-addr 127.0.0.(R+1) --nproc-per-node 1``
  launchers on this machine, each with its own run directory.

Each round runs both, in an alternating order; ``wall`` is from the launch to the last
launcher's exit (rendezvous, imports and the bucket included), ``train`` the chief's
"trained ... in X s" (the loop alone). The best round is the least disturbed one; the
median shows the spread.

Reproduce (from the repository root)::

    python benchmarks/bench_multinode.py --epochs 4 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEC = """\
[run]
task = "bench_multinode:make_task"
max_epochs = {epochs}
seed = 1
checkpoint_dir = "s3://bench/{name}"

[run.storage_options]
client_kwargs = {{ endpoint_url = "{endpoint}" }}

[callbacks.save]
type = "ModelSaver"
keep = 2
trigger = {{ any = [{{ every = "20 steps" }}, {{ on = "train_end" }}] }}
"""


def make_task() -> Any:
    """The benchmark's job (imported by each rank through the spec)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from schedtrain.training import Task

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 2))
    return Task(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                train_data=DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                loss_fn=torch.nn.functional.cross_entropy)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(nodes: int, folder: Path, endpoint: str, epochs: int, name: str) -> tuple[float, float]:
    """One run: its wall time and the chief's training time, in seconds."""
    spec = folder / f"{name}.toml"
    spec.write_text(SPEC.format(epochs=epochs, name=name, endpoint=endpoint))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
           "OMP_NUM_THREADS": "1", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    port, procs = _port(), []
    start = time.perf_counter()
    for r in range(nodes):
        where = ["--standalone", "--nproc-per-node", "2"] if nodes == 1 else [
            "--nnodes", "2", "--node-rank", str(r), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", f"127.0.0.{r + 1}",
            "--nproc-per-node", "1"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *where, "-m", "schedtrain",
             "train", str(spec), "--run-dir", str(folder / name / f"node{r}")],
            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=600) for p in procs]
    wall = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise SystemExit(f"{name} failed:\n" + "\n".join(err[-2000:] for _, err in outs))
    trained = re.search(r"steps in ([0-9.]+) s", outs[0][0])
    return wall, float(trained[1]) if trained else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request else

    port = _port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="bench",
                      secret="bench").mkdir("bench")
    times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                for nodes in ((1, 2) if i % 2 == 0 else (2, 1)):
                    times[nodes].append(run(nodes, Path(tmp), endpoint, args.epochs,
                                            f"r{i}-n{nodes}"))
    finally:
        server.stop()
    steps = args.epochs * 2048 // 32
    print(f"{args.epochs} epochs, {steps} steps, 2 ranks, {args.repeats} rounds "
          "(seconds: best / median)")
    for nodes, label in ((1, "1 node x 2 processes"), (2, "2 nodes x 1 process")):
        wall, train = zip(*times[nodes], strict=True)
        print(f"  {label:22s} wall {min(wall):6.1f} / {statistics.median(wall):6.1f}"
              f"   train {min(train):5.2f} / {statistics.median(train):5.2f}")
    ratio = min(w for w, _ in times[2]) / min(w for w, _ in times[1])
    train_ratio = min(t for _, t in times[2]) / min(t for _, t in times[1])
    print(f"  ratio 2 nodes / 1 node: wall {ratio:.2f}, train {train_ratio:.2f}")


if __name__ == "__main__":
    main()
