"""The frames of `pods/portforward` over WebSocket, as the kubelet serves them
(`v4.channel.k8s.io`, binary), for both sides: `kubectl nodeflow`'s forward
(nodeflow_cli.portforward) and the emulator's kubelet (clustersim.kube.portforward).

Every message's first byte is its channel: for the i-th requested port, channel 2i carries
the data both ways and channel 2i+1 the errors the server reports. The server first writes
the port (uint16, little-endian) on both channels; a text on the error channel means the
forward of that port failed.
"""

from __future__ import annotations

CHANNEL_PROTOCOL = "v4.channel.k8s.io"
# How much of a connection is read (and sent as one message) at a time.
READ_SIZE = 64 * 1024


def data_channel(index: int) -> int:
    return 2 * index


def error_channel(index: int) -> int:
    return 2 * index + 1


def port_index(channel: int) -> int:
    """The index of the port a channel belongs to."""
    return channel // 2


def is_data_channel(channel: int) -> bool:
    return channel % 2 == 0


def frame(channel: int, payload: bytes) -> bytes:
    """One message: its channel byte, then the payload."""
    return bytes([channel]) + payload


def split_frame(message: bytes) -> tuple[int, bytes]:
    """(channel, payload) of one message; an empty message is not a frame."""
    if not message:
        raise ValueError("an empty WebSocket message carries no channel")
    return message[0], message[1:]


PORT_PREFIX_SIZE = 2


def port_prefix(port: int) -> bytes:
    """What the server writes first on both channels of a port: the port, little-endian."""
    return port.to_bytes(PORT_PREFIX_SIZE, "little")
