#!/usr/bin/env python3
"""A kubelet PodResources v1 stand-in in plain Python (no grpcio): serves
v1.PodResourcesLister/List on a unix socket so that `kgpu exporter -k` attributes GPUs to pods
in a shell script (tests/rules/capture_golden.sh). The C++ tests have their own stand-in
(tests/testing/fake_podresources.h); this one exists because no script can start that one.

usage: fake_podresources.py SOCKET PODS_JSON

PODS_JSON is a list of pods, as kubelet reports them:
  [{"namespace": "ml", "name": "train-0",
    "containers": [{"name": "main",
                    "devices": [{"resource": "nvidia.com/gpu", "ids": ["GPU-..."]}]}]}]

It speaks just enough HTTP/2 (cleartext, prior knowledge, as gRPC over a unix socket does):
the connection preface, SETTINGS and PING acknowledgements, and for every request stream a
gRPC response carrying ListPodResourcesResponse, whatever method was asked (the request's
HPACK-coded headers are not decoded: the exporter calls List only). The protobuf message is
encoded by hand (field numbers from proto/podresources_v1.proto). Runs until killed.
"""

import json
import os
import socketserver
import struct
import sys

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 6, 7, 8  # frame types
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4  # flags
MAX_FRAME = 16384  # the client's SETTINGS_MAX_FRAME_SIZE default


# ---- protobuf (proto3 wire format: length-delimited fields only)
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def encode_response(pods):
    # ListPodResourcesResponse{1: PodResources{1 name, 2 namespace, 3 ContainerResources{
    #   1 name, 2 ContainerDevices{1 resource_name, 2 device_ids}}}}
    out = b""
    for p in pods:
        pod = field(1, p["name"]) + field(2, p["namespace"])
        for c in p.get("containers", []):
            cont = field(1, c["name"])
            for d in c.get("devices", []):
                dev = field(1, d["resource"]) + b"".join(field(2, i) for i in d["ids"])
                cont += field(2, dev)
            pod += field(3, cont)
        out += field(1, pod)
    return out


# ---- HPACK: literal header fields without indexing, no Huffman coding
def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack(headers):
    out = b""
    for name, value in headers:
        if name == ":status" and value == "200":
            out += b"\x88"  # static table index 8
            continue
        out += b"\x00" + hpack_int(len(name), 7) + name.encode() + hpack_int(len(value), 7) + value.encode()
    return out


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


class Handler(socketserver.BaseRequestHandler):
    def read_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.request.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def respond(self, stream):
        body = encode_response(self.server.pods)
        msg = b"\x00" + struct.pack(">I", len(body)) + body  # gRPC: uncompressed, length, message
        out = frame(HEADERS, END_HEADERS, stream, hpack([(":status", "200"), ("content-type", "application/grpc")]))
        for i in range(0, len(msg), MAX_FRAME):
            out += frame(DATA, 0, stream, msg[i:i + MAX_FRAME])
        out += frame(HEADERS, END_HEADERS | END_STREAM, stream, hpack([("grpc-status", "0")]))
        self.request.sendall(out)

    def handle(self):
        try:
            if self.read_exact(len(PREFACE)) != PREFACE:
                return
            self.request.sendall(frame(SETTINGS, 0, 0))
            while True:
                head = self.read_exact(9)
                length = struct.unpack(">I", b"\x00" + head[:3])[0]
                ftype, flags = head[3], head[4]
                stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
                payload = self.read_exact(length) if length else b""
                if ftype == SETTINGS and not flags & ACK:
                    self.request.sendall(frame(SETTINGS, ACK, 0))
                elif ftype == PING and not flags & ACK:
                    self.request.sendall(frame(PING, ACK, 0, payload))
                elif ftype == GOAWAY:
                    return
                elif ftype in (HEADERS, DATA) and flags & END_STREAM and stream:
                    if ftype == DATA and length:
                        # Give the connection and the stream their window back.
                        upd = struct.pack(">I", length)
                        self.request.sendall(frame(WINDOW_UPDATE, 0, 0, upd) + frame(WINDOW_UPDATE, 0, stream, upd))
                    self.respond(stream)
        except (EOFError, ConnectionError, OSError):
            return


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, pods_file = sys.argv[1:]
    with open(pods_file, encoding="utf-8") as f:
        pods = json.load(f)
    if os.path.exists(path):
        os.unlink(path)
    server = Server(path, Handler)
    server.pods = pods
    print(f"fake_podresources: serving {len(pods)} pod(s) on {path}", flush=True)
    try:
        server.serve_forever()
    finally:
        os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
