"""Plays a vLLM engine's KV-event sockets with pyzmq (libzmq), for the ZMTP test.

    zmq_engine_peer.py PUB_PORT ROUTER_PORT TOPIC LIVE_PAYLOAD BUFFERED_PAYLOAD...

Binds a PUB and a ROUTER on 127.0.0.1, as vLLM 0.32's ZmqEventPublisher does. The buffered payloads are
batches 0, 1, ... that were published before anyone listened: the ROUTER replays them, answering
[identity, "", start seq] with [identity, "", topic, seq, payload] for each buffered batch from start seq
on, then the end marker [identity, "", "", -1, ""]. The live payload is the next batch, published on the
PUB again and again (a subscription reaches a PUB at some point after the subscriber connects; the
agent takes the repeats for duplicates) until a DEALER sends "stop" or 20 seconds pass. The PUB sends
ZMTP heartbeats (PING) every 50 ms and drops a peer that does not answer within 300 ms, so a
subscriber that stays connected answers them.
"""

import sys
import time

import zmq

pub_port, router_port, topic = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
live = open(sys.argv[4], "rb").read()
buffered = [open(path, "rb").read() for path in sys.argv[5:]]

context = zmq.Context()
pub = context.socket(zmq.PUB)
pub.setsockopt(zmq.HEARTBEAT_IVL, 50)
pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 300)
pub.bind(f"tcp://127.0.0.1:{pub_port}")
router = context.socket(zmq.ROUTER)
router.bind(f"tcp://127.0.0.1:{router_port}")

live_seq = len(buffered).to_bytes(8, "big")
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    pub.send_multipart((topic, live_seq, live))
    if router.poll(20):
        frames = router.recv_multipart()
        if len(frames) == 3 and frames[2] == b"stop":
            break
        if len(frames) != 3:
            print(f"bad replay request {frames!r}", file=sys.stderr)
            continue
        identity, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in enumerate(buffered):
            if seq >= start_seq:
                router.send_multipart((identity, b"", topic, seq.to_bytes(8, "big"), payload))
        router.send_multipart((identity, b"", b"", (-1).to_bytes(8, "big", signed=True), b""))
pub.close(linger=0)
router.close(linger=0)
context.term()
