"""The embedded engine's KV cache: one preallocated row (slot) per request in the batch.

Each layer's keys and values live in tensors of [slots, kv_heads, capacity, head_dim] that are
written in place, so a decoding step appends nothing: a request in slot r keeps its token i
at column i, whatever the other rows hold. The running requests occupy slots 0..n-1 (the
engine moves a row down when one before it leaves), so a forward over them reads a view of
the tensors, never a gathered copy. Slots and columns grow by doubling (up to the engine's
batch size; the copy is paid rarely), so memory follows the most rows and the longest context
seen (46 KB a token a row for SmolLM2-135M), not the model's whole length for 32 rows; longer
columns go only to the slots in use when they grow. An engine with no request left gives
every slot back (`release`), so an idle engine holds no cache (issue 36: 360 MB at start for
32 slots, 720 MB after a burst of 32 requests, kept for good).

A forward is set up with `select`: which slots its rows are, the column each of its input
positions is written to, and how many columns the attention reads. The model calls `update`
per layer (transformers' Cache protocol, duck-typed), which writes the new keys and values
and returns the view the attention reads; the caller's 4-D mask hides what a row must not
see (other requests' leftovers beyond its length, padding).
"""

import torch

FIRST_CAPACITY = 256


class BatchCache:
    def __init__(self, config, max_slots: int, dtype=torch.float32):
        self.max_slots = max_slots
        self.layers = config.num_hidden_layers
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None)
        head_dim = head_dim or config.hidden_size // config.num_attention_heads
        self._shape = (heads, head_dim)
        self.dtype = dtype
        self.slots = self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._rows = slice(0, 0)
        self._row_index = torch.zeros(0, 1, dtype=torch.long)
        self._columns: torch.Tensor | None = None
        self._width = 0

    def reserve(self, slots: int, columns: int):
        """Room for `slots` rows of `columns` tokens (doubling, so growth is paid rarely).
        Zeros, not garbage: a masked column still enters the attention's sums times 0."""
        if slots <= self.slots and columns <= self.capacity:
            return
        # Longer columns are given to the slots asked for (the rows in use), not to every slot
        # held: 32 preallocated slots grown to a tau2 prompt's 8,192 columns would be 12 GB.
        # Slots beyond `slots` hold no row the caller still needs (the engine's rows are
        # slots 0..n-1), so they are dropped and added again, by doubling, when asked for.
        grown_slots = max(1, self.slots if columns <= self.capacity else 1)
        while grown_slots < slots:
            grown_slots *= 2
        grown_slots = min(max(grown_slots, slots), max(self.max_slots, slots))
        capacity = max(FIRST_CAPACITY, self.capacity)
        while capacity < columns:
            capacity *= 2
        kept = min(self.slots, grown_slots)
        heads, head_dim = self._shape
        grown_keys, grown_values = [], []
        for layer in range(self.layers):
            for old, grown in ((self.keys, grown_keys), (self.values, grown_values)):
                tensor = torch.zeros(grown_slots, heads, capacity, head_dim, dtype=self.dtype)
                if kept:
                    tensor[:kept, :, : self.capacity] = old[layer][:kept]
                grown.append(tensor)
        self.keys, self.values = grown_keys, grown_values
        self.slots, self.capacity = grown_slots, capacity

    def release(self):
        """Drop every slot (no row is in use); the next `reserve` allocates afresh."""
        self.keys, self.values = [], []
        self.slots = self.capacity = 0

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in (*self.keys, *self.values))

    def select(self, first: int, columns: torch.Tensor, width: int):
        """Set up the next forward: its rows are slots first.., its input position j of row i
        is written at column columns[i, j], and attention reads columns 0..width-1."""
        self.reserve(first + columns.shape[0], max(width, int(columns.max()) + 1))
        self._rows = slice(first, first + columns.shape[0])
        self._row_index = torch.arange(columns.shape[0]).unsqueeze(1)
        self._columns = columns
        self._width = width

    # transformers' Cache protocol, as its decoder layers use it ------------------------------

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        rows = self._row_index
        keys, values = self.keys[layer_idx][self._rows], self.values[layer_idx][self._rows]
        # [rows, heads, positions, dim] -> [rows, positions, heads, dim], as the index lays it
        keys[rows, :, self._columns] = key_states.transpose(1, 2)
        values[rows, :, self._columns] = value_states.transpose(1, 2)
        return keys[:, :, : self._width], values[:, :, : self._width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._width  # only read when no position_ids are given; the engine gives them

    # Rows -------------------------------------------------------------------------------------

    def move(self, source: int, target: int, length: int):
        """Copy the first `length` columns of slot `source` into slot `target`."""
        for tensors in (self.keys, self.values):
            for tensor in tensors:
                tensor[target, :, :length] = tensor[source, :, :length]

    def read(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of the slot's first `length` columns, per layer (kept for prefix reuse)."""
        return [
            (keys[slot, :, :length].clone(), values[slot, :, :length].clone())
            for keys, values in zip(self.keys, self.values, strict=True)
        ]

    def write(self, slot: int, states: list[tuple[torch.Tensor, torch.Tensor]], length: int):
        """Put the first `length` columns of stored states (from `read`) into the slot."""
        self.reserve(slot + 1, length)
        for layer, (keys, values) in enumerate(states):
            self.keys[layer][slot, :, :length] = keys[:, :length]
            self.values[layer][slot, :, :length] = values[:, :length]
