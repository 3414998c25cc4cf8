"""Helpers shared by several test modules."""

import numpy as np


def normalize(obj):
    """A canonical, comparable form of a (nested) state_dict.

    dict -> sorted (key, value) tuples, set -> sorted list, numpy array ->
    (dtype, shape, bytes), sequences element-wise; everything else as is.
    Two states are equal iff their normalized forms are equal.
    """
    if isinstance(obj, dict):
        return (
            "dict",
            tuple(sorted(((repr(normalize(k)), normalize(v)) for k, v in obj.items()), key=lambda kv: kv[0])),
        )
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted((normalize(x) for x in obj), key=repr)))
    if isinstance(obj, np.ndarray):
        return ("nd", str(obj.dtype), obj.shape, obj.tobytes())
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(normalize(x) for x in obj))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(obj))
    if isinstance(obj, float) and obj != obj:
        return ("nan",)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
