"""TileattnCache: transformers' DynamicCache without the per-token copy of the whole cache.

transformers' DynamicLayer appends each decode step's keys and values with ``torch.cat``, which
allocates and copies the layer's whole cache every step (O(N) per token; on a Llama-3-8B-shaped
layer at 2048 cached tokens that is two fresh 4 MB bf16 tensors per layer and step). Here the
keys and values of full-attention layers live in buffers ``[B, Hkv, capacity, D]`` allocated
ahead (capacity doubles when full, so a long generation reallocates O(log N) times), the new
tokens are copied into place, and ``update`` returns ``[B, Hkv, length, D]`` views of the
buffers, which tileattn's attention reads in place with their strides.

Sliding-window, chunked and other layer types keep transformers' own layers (a sliding layer
holds only its window, so it has no whole-cache copy to save).

Why not tileattn.attention_with_kvcache (its fused append and RoPE): transformers' attention
layers apply RoPE and call ``cache.update`` before they call the attention function, so the
attention function receives keys that are already rotated and already appended; the append that
remains is a copy of the new tokens only (4 KB per layer and decode step at 8 KV heads, D = 128,
bf16), which fusing would not measurably save.
"""
from transformers.cache_utils import DynamicCache, DynamicLayer

GRANULE = 256  # capacities are multiples of this many tokens


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer over preallocated buffers; ``keys``/``values`` are views
    ``[B, Hkv, length, D]`` of ``[B, Hkv, capacity, D]`` buffers."""

    def __init__(self, capacity=0, **kwargs):
        super().__init__(**kwargs)
        self.capacity_hint = int(capacity)
        self.key_buffer = self.value_buffer = None  # [B, Hkv, capacity, D]
        self.length = 0

    def lazy_initialization(self, key_states, value_states):
        self.device = key_states.device
        self.length = 0
        self.is_initialized = True

    def capacity(self):
        return 0 if self.key_buffer is None else self.key_buffer.shape[2]

    def _fits(self, buffer, states, needed):
        return (buffer is not None and buffer.shape[2] >= needed and buffer.dtype == states.dtype
                and buffer.device == states.device
                and buffer.shape[:2] + buffer.shape[3:] == states.shape[:2] + states.shape[3:])

    def _reserve(self, key_states, value_states, needed):
        """Buffers that hold `needed` tokens of the states' batch, heads, head_dim and dtype;
        the cached tokens are kept."""
        if self._fits(self.key_buffer, key_states, needed) and self._fits(self.value_buffer, value_states, needed):
            return
        if self.length and not (self._fits(self.key_buffer, key_states, 0)
                                and self._fits(self.value_buffer, value_states, 0)):
            raise ValueError(
                f"TileattnCache: new keys {tuple(key_states.shape)} {key_states.dtype} do not match the cached "
                f"{tuple(self.key_buffer.shape)} {self.key_buffer.dtype} (batch, heads, head_dim and dtype must stay)")
        capacity = max(needed, self.capacity_hint, 2 * self.capacity())
        capacity = -(-capacity // GRANULE) * GRANULE
        b, h, _, d = key_states.shape
        keys = key_states.new_empty(b, h, capacity, d)
        values = value_states.new_empty(b, value_states.shape[1], capacity, value_states.shape[3])
        if self.length:
            keys[:, :, :self.length].copy_(self.key_buffer[:, :, :self.length])
            values[:, :, :self.length].copy_(self.value_buffer[:, :, :self.length])
        self.key_buffer, self.value_buffer = keys, values

    def _set_views(self):
        self.keys = self.key_buffer[:, :, :self.length]
        self.values = self.value_buffer[:, :, :self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        """Copies key/value states ``[B, Hkv, n, D]`` after the cached tokens; returns the views
        of every cached token, ``[B, Hkv, length + n, D]``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        self._reserve(key_states, value_states, end)
        self.key_buffer[:, :, start:end].copy_(key_states)
        self.value_buffer[:, :, start:end].copy_(value_states)
        self.length = end
        self._set_views()
        return self.keys, self.values

    def get_seq_length(self):
        return self.length if self.is_initialized else 0

    def reset(self):
        """Empties the layer; the buffers are kept for the next generation."""
        self.length = 0
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove):
        if tokens_to_remove > 0:
            raise ValueError(f"crop: expected a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(0, self.length + tokens_to_remove)
        self._set_views()

    def _map_buffers(self, function):
        if self.length:
            self.key_buffer, self.value_buffer = function(self.key_buffer), function(self.value_buffer)
            self._set_views()

    def batch_repeat_interleave(self, repeats):
        self._map_buffers(lambda x: x.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices):
        self._map_buffers(lambda x: x[indices])

    def reorder_cache(self, beam_idx):
        self._map_buffers(lambda x: x.index_select(0, beam_idx.to(x.device)))


class TileattnCache(DynamicCache):
    """``DynamicCache`` whose full-attention layers append in place (see the module docstring).

        cache = tileattn.transformers.TileattnCache(config=model.config, capacity=prompt + new)
        model.generate(ids, cache=cache, ...)     # transformers 4.x: past_key_values=cache

    ``capacity``: tokens to allocate for at the first update (0: what the prompt needs, rounded
    up to 256); the buffers double when a generation outgrows them.
    """

    def __init__(self, config=None, capacity=0, **kwargs):
        super().__init__(config=config, **kwargs)
        self.layers = [self._growing(layer, capacity) if type(layer) is DynamicLayer else layer
                       for layer in self.layers]
        if self.layer_class_to_replicate is DynamicLayer:
            self.layer_class_to_replicate = lambda: GrowingLayer(capacity)

    @staticmethod
    def _growing(layer, capacity):
        """A GrowingLayer holding what the DynamicLayer `layer` holds (DynamicCache fills its layers
        from ``ddp_cache_data`` before they are replaced here)."""
        grown = GrowingLayer(capacity)
        if layer.is_initialized and layer.keys is not None and layer.keys.numel():
            grown.update(layer.keys, layer.values)
        return grown
