"""tileattn.load_huggingface_weights: one layer's attention weights from a Llama-style checkpoint."""
import json
import os

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _tensor_names(layer_idx):
    """{key of the returned dict: checkpoint tensor name}, weights and the biases a layer may have."""
    names = {p: f"model.layers.{layer_idx}.self_attn.{p}.weight" for p in PROJECTIONS}
    names.update({f"{p}.bias": f"model.layers.{layer_idx}.self_attn.{p}.bias" for p in PROJECTIONS})
    return names


def _files_for(path, names, prefix):
    """The safetensors files to read for `names`, for a file or a checkpoint folder: with an
    index, every shard that holds a tensor under `prefix` (the layer's attention), so that
    biases and tensors this layer does not build (q_norm, sinks) are seen in any shard; without
    one, every shard."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"path: {path!r} is neither a .safetensors file nor a folder")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):  # sharded checkpoint: the index maps tensors to shards
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        for name in names:
            if name not in weight_map:
                raise KeyError(f"{name} is not in {index}")
        return sorted({os.path.join(path, shard) for name, shard in weight_map.items() if name.startswith(prefix)})
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not shards:
        raise FileNotFoundError(f"path: no .safetensors file in {path!r}")
    return [os.path.join(path, f) for f in shards]


def load_huggingface_weights(path, layer_idx):
    """The attention weights of layer ``layer_idx`` of a Llama-style safetensors checkpoint.

    Args:
        path: a ``.safetensors`` file, or a folder holding ``model.safetensors`` or shards with
            ``model.safetensors.index.json`` (as Hugging Face saves them). Only local files are
            read; nothing is downloaded.
        layer_idx: the decoder layer, ``model.layers.{layer_idx}.self_attn.*``.

    Returns:
        dict with torch tensors ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (the
        ``nn.Linear`` weights, ``[out_features, in_features]``, in the checkpoint's dtype) and
        the biases the checkpoint has (``q_proj.bias`` ..., Qwen2's q/k/v), ready for
        ``FlashAttention.load_weights``. A tensor of the layer's attention that is none of
        these (q_norm, k_norm, sinks) raises KeyError naming it.
    """
    from safetensors import safe_open

    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx: expected an int >= 0, got {layer_idx!r}")
    wanted = _tensor_names(layer_idx)
    prefix = f"model.layers.{layer_idx}.self_attn."
    found, unknown = {}, []
    weight_names = [wanted[p] for p in PROJECTIONS]
    for file in _files_for(os.fspath(path), weight_names, prefix):
        with safe_open(file, framework="pt") as f:
            keys = set(f.keys())
            for key, name in wanted.items():
                if key not in found and name in keys:
                    found[key] = f.get_tensor(name)
            unknown += [k for k in keys if k.startswith(prefix) and k not in wanted.values()
                        and not k.startswith(prefix + "rotary_emb.")]
    missing = [wanted[p] for p in PROJECTIONS if p not in found]
    if missing:
        raise KeyError(f"layer_idx: {', '.join(missing)} not found in {path!r}")
    if unknown:  # q_norm / k_norm (Qwen3, Gemma 3), sinks (gpt-oss): not a layer this class builds
        raise KeyError(f"layer_idx: {', '.join(sorted(unknown))} in {path!r} is not a tensor of this "
                       "attention layer (not supported)")
    return found
