"""tileattn.load_huggingface_weights: one layer's attention weights from a Llama-style checkpoint."""
import json
import os

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _tensor_names(layer_idx):
    return {p: f"model.layers.{layer_idx}.self_attn.{p}.weight" for p in PROJECTIONS}


def _files_for(path, names):
    """{safetensors file: [tensor names]} covering `names`, for a file or a checkpoint folder."""
    if os.path.isfile(path):
        return {path: list(names)}
    if not os.path.isdir(path):
        raise FileNotFoundError(f"path: {path!r} is neither a .safetensors file nor a folder")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):  # sharded checkpoint: the index maps tensors to shards
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = {}
        for name in names:
            if name not in weight_map:
                raise KeyError(f"{name} is not in {index}")
            files.setdefault(os.path.join(path, weight_map[name]), []).append(name)
        return files
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not shards:
        raise FileNotFoundError(f"path: no .safetensors file in {path!r}")
    return {os.path.join(path, f): None for f in shards}  # None: look in every shard


def load_huggingface_weights(path, layer_idx):
    """The attention weights of layer ``layer_idx`` of a Llama-style safetensors checkpoint.

    Args:
        path: a ``.safetensors`` file, or a folder holding ``model.safetensors`` or shards with
            ``model.safetensors.index.json`` (as Hugging Face saves them). Only local files are
            read; nothing is downloaded.
        layer_idx: the decoder layer, ``model.layers.{layer_idx}.self_attn.*``.

    Returns:
        dict with torch tensors ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (the
        ``nn.Linear`` weights, ``[out_features, in_features]``, in the checkpoint's dtype),
        ready for ``FlashAttention.load_weights``. Only these four tensors are read.
    """
    from safetensors import safe_open

    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx: expected an int >= 0, got {layer_idx!r}")
    wanted = _tensor_names(layer_idx)
    found = {}
    for file, names in _files_for(os.fspath(path), wanted.values()).items():
        with safe_open(file, framework="pt") as f:
            keys = set(f.keys())
            for proj, name in wanted.items():
                if proj not in found and name in keys and (names is None or name in names):
                    found[proj] = f.get_tensor(name)
    missing = [wanted[p] for p in PROJECTIONS if p not in found]
    if missing:
        raise KeyError(f"layer_idx: {', '.join(missing)} not found in {path!r}")
    return found
