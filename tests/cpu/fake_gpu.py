"""Stand-ins for a GPU on the CPU: arrays with CuPy's attributes over no memory, a device table
instead of the driver, and gemm() launches captured instead of run (the compile is real)."""
import types

import ml_dtypes
import numpy as np
import pytest

from deepgemm import api, arrays, caches, device

# A GPU that no tuned table was recorded on, so "auto" decides by the heuristics.
FAKE_GPU = {"name": "Fake GPU", "cc": 90, "sm_count": 132}


class FakeDeviceArray:
    """The attributes of cupy.ndarray that deepgemm reads, over a host buffer's geometry."""

    _next_ptr = 1 << 32   # where the next array without a given base_ptr starts

    def __init__(self, shape, dtype="float16", strides=None, offset=0, device=0, base_ptr=None):
        """base_ptr: where the allocation starts; by default a fresh range apart from every other
        fake array's (as a real allocator gives), 256-byte aligned."""
        self.dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        self.shape = tuple(shape)
        self.ndim = len(shape)
        item = self.dtype.itemsize
        if strides is None:  # C-contiguous
            strides, step = [], item
            for s in reversed(self.shape):
                strides.insert(0, step)
                step *= max(s, 1)
        self.strides = tuple(strides)
        if base_ptr is None:
            span = (offset + 1 + sum((n - 1) * abs(st) // item for n, st in zip(self.shape, self.strides) if n)) * item
            base_ptr = FakeDeviceArray._next_ptr
            FakeDeviceArray._next_ptr += -(-span // 256) * 256 + 256
        self.device = types.SimpleNamespace(id=device)
        self.data = types.SimpleNamespace(ptr=base_ptr + offset * item)

    def __getitem__(self, index):
        """x[i] or x[i, j, ...] with integers: the view of one matrix of a batch."""
        index = index if isinstance(index, tuple) else (index,)
        if not all(isinstance(i, int) for i in index):
            raise TypeError("the fake array takes integer indices only")
        offset = sum(i * s for i, s in zip(index, self.strides))
        view = FakeDeviceArray(self.shape[len(index):], str(self.dtype), self.strides[len(index):],
                               device=self.device.id, base_ptr=self.data.ptr + offset)
        return view

    @property
    def T(self):
        t = FakeDeviceArray(self.shape[::-1], str(self.dtype), self.strides[::-1],
                            device=self.device.id, base_ptr=self.data.ptr)
        t.data = types.SimpleNamespace(**vars(self.data))
        return t


@pytest.fixture
def gpus(monkeypatch):
    """deepgemm.device answers from a table instead of the driver: device 0 is FAKE_GPU until the
    test calls gpus({id: {"name", "cc" (int), "sm_count"}}). Device facts, and everything derived
    from them (tables, decisions, plans), are forgotten before, on every change and after."""
    devices = {0: dict(FAKE_GPU)}

    def query(dev):
        if dev not in devices:
            raise RuntimeError(f"no CUDA device {dev}")
        return dict(devices[dev])

    def set_devices(new):
        devices.clear()
        devices.update(new)
        caches.clear("device")
    monkeypatch.setattr(device, "_query", query)
    caches.clear("device")
    yield set_devices
    caches.clear("device")


@pytest.fixture
def captured(monkeypatch, gpus):
    """Route gemm() through the fakes; return the list of captured launches."""
    launches = []
    monkeypatch.setattr(arrays, "framework_of", lambda x: "cupy" if isinstance(x, FakeDeviceArray) else "host")
    monkeypatch.setattr(arrays, "as_cupy", lambda x, name: x if isinstance(x, FakeDeviceArray)
                        else (_ for _ in ()).throw(TypeError(f"{name}: expected a GPU array")))
    monkeypatch.setattr(arrays, "empty", lambda shape, dtype, fw, dev: (FakeDeviceArray(shape, dtype),) * 2)
    monkeypatch.setattr(arrays, "stream_for", lambda fw, device=0: None)
    monkeypatch.setattr(arrays, "capturing", lambda fw, device=0: False)
    monkeypatch.setattr(api, "_workspace", lambda nbytes, dev, stream: type("Fake", (), {"ptr": 1 << 40})())
    monkeypatch.setattr(api, "launch", lambda compiled, dev, grid, block, smem, args, stream, pdl=False:
                        launches.append(dict(compiled=compiled, grid=grid, block=block, smem=smem,
                                             params=args[0], args=args, pdl=pdl)))
    return launches


def F(*shape, **kw):
    return FakeDeviceArray(shape, **kw)


def as_fake(x):
    """A NumPy array as a fake device array over the same memory (address, strides, dtype); other
    values as they are."""
    if not isinstance(x, np.ndarray):
        return x
    dtype = "bfloat16" if x.dtype == ml_dtypes.bfloat16 else str(x.dtype)
    return FakeDeviceArray(x.shape, dtype, strides=x.strides, base_ptr=x.__array_interface__["data"][0])




@pytest.fixture
def fake_encode(monkeypatch):
    """tma.encode recording its arguments instead of calling the driver; the map it returns holds
    the address and the call's number (from 1) in its first two words, so a test can tell maps apart."""
    from deepgemm import tma
    calls = []

    def encode(ptr, dtype, dims, box, stride):
        calls.append(dict(ptr=ptr, dtype=dtype, dims=dims, box=box, stride=stride))
        m = np.zeros((), dtype=tma.TENSOR_MAP_DTYPE)
        m["opaque"][:2] = ptr, len(calls)
        return m
    monkeypatch.setattr(tma, "encode", encode)
    return calls
