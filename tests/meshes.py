"""The context meshes the attention tests split a row over: strategy -> P (devices on the sequence) -> mesh."""

MESHES = {
    "all_gather": {P: {"context": P} for P in (2, 4, 8)},
    "ulysses": {P: {"context": P} for P in (2, 4, 8)},
    "ring": {P: {"context": P} for P in (2, 4, 8)},
    "usp": {
        2: {"context": 2},
        4: {"context": 2, "context_ulysses": 2},
        8: {"context": 4, "context_ulysses": 2},
    },
    "double_ring": {
        2: {"context_ulysses": 2},
        4: {"context": 2, "context_ulysses": 2},
        8: {"context": 2, "context_ulysses": 4},
    },
}
