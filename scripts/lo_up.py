"""Bring the loopback interface up (``ip link set lo up`` for machines without iproute2), e.g.
as the first command inside ``unshare --net``."""

import fcntl
import socket
import struct

SIOCSIFFLAGS, IFF_UP, IFF_RUNNING = 0x8914, 0x1, 0x40
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", IFF_UP | IFF_RUNNING))
