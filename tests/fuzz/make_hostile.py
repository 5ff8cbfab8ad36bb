#!/usr/bin/env python3
"""Hostile safetensors files and diffusers folders, for tests and fuzzing.

usage:
  make_hostile.py corpus OUTDIR   seed corpora: OUTDIR/safetensors/<case> (raw files for
                                  fuzz_safetensors), OUTDIR/json_index/<case>.json (index
                                  texts for fuzz_json_index, whose fixed folder is described
                                  by FUZZ_SHARDS below) and OUTDIR/model_config/<case>
                                  (config + tensor names for fuzz_model_config)
  make_hostile.py cli OUTDIR      the hostile cases as files and folders for `tprun inspect`,
                                  plus OUTDIR/cases.tsv: name <TAB> path <TAB> text the error
                                  must contain (a tensor name, or '-' where there is none)
                                  <TAB> extra options of `tprun inspect` ('-' for none);
                                  OUTDIR/valid.safetensors is a good file

Also hostile config.json files (CONFIG_CASES: block counts beyond what the checkpoint holds,
implausible sizes) beside a checkpoint of tensor names, for every model family.

Standard library only (no numpy, no safetensors): the point is to write what a correct
writer never would. tests/unit/test_safetensors.cpp builds the same cases in C++.
"""
import json
import os
import struct
import sys


def st(header, data=b"", length=None):
    """A safetensors file: 8-byte little-endian length, header text, data."""
    if not isinstance(header, (bytes, str)):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def t(dtype, shape, begin, end, **extra):
    entry = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    entry.update(extra)
    return entry


W = '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'

# name -> (bytes, text the error must contain, or None where no tensor is involved)
FILE_CASES = {
    "empty_file": (b"", None),
    "too_short": (b"\x10\x00\x00", None),
    "truncated_body": (st({"w": t("F32", [2, 2], 0, 16)}, b"\0" * 10), "w"),
    "header_length_past_end": (st(W, b"\0" * 8, length=4096), None),
    "huge_header_length": (st(W, b"\0" * 8, length=100000001), None),
    "header_length_2e63": (st(W, b"\0" * 8, length=1 << 63), None),
    "header_not_json": (st("{this is not json", b""), None),
    "header_not_utf8": (st(b'{"\xff\xfe":{}}', b""), None),
    "json_not_object": (st("[1,2,3]", b""), None),
    "duplicate_tensor": (st('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                            '"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8), "w"),
    "duplicate_field": (st('{"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}',
                           b"\0" * 4), "dtype"),
    "overlapping_offsets": (st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, b"\0" * 12), "b"),
    "holey_offsets": (st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, b"\0" * 12), "b"),
    "reversed_offsets": (st({"w": t("F32", [1], 8, 4)}, b"\0" * 8), "w"),
    "trailing_bytes": (st({"w": t("F32", [1], 0, 4)}, b"\0" * 6), None),
    "size_mismatch": (st({"w": t("F32", [2, 2], 0, 12)}, b"\0" * 12), "w"),
    "shape_overflow": (st({"w": t("F32", [1 << 40, 1 << 40, 1 << 40], 0, 0)}), "w"),
    "shape_wraps_128_bits": (st({"w": t("F32", [1 << 61, 1 << 62], 0, 0)}), "w"),
    "negative_dim": (st({"w": t("F32", [-1, 4], 0, 0)}), "w"),
    "negative_offset": (st({"w": t("F32", [1], -4, 0)}), "w"),
    "float_dim": (st({"w": t("F32", [2.5], 0, 10)}, b"\0" * 10), "w"),
    "unknown_dtype": (st({"w": t("F128", [1], 0, 16)}, b"\0" * 16), "w"),
    "sub_byte_shape": (st({"w": t("F4", [3], 0, 2)}, b"\0" * 2), "w"),
    "metadata_not_string": (st({"__metadata__": {"format": 1}, "w": t("F32", [1], 0, 4)}, b"\0" * 4), None),
    "metadata_not_object": (st({"__metadata__": "pt", "w": t("F32", [1], 0, 4)}, b"\0" * 4), None),
    "unknown_field": (st({"w": t("F32", [1], 0, 4, extra=1)}, b"\0" * 4), "w"),
    "entry_not_object": (st({"w": 5}), "w"),
    "deeply_nested_shape": (st('{"w":{"dtype":"F32","shape":[' + "[" * 70 + "]" * 70 + '],"data_offsets":[0,4]}}',
                               b"\0" * 4), None),
    "missing_dtype": (st({"w": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "w"),
    "offsets_arity": (st({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4), "w"),
}

# A valid file with several dtypes, a zero-element tensor and metadata.
VALID = st({"__metadata__": {"format": "pt"},
            "a": t("F32", [2, 2], 0, 16),
            "b": t("BF16", [3], 16, 22),
            "c": t("F16", [0, 4], 22, 22),
            "d": t("F4", [2, 3], 22, 25),
            "e": t("I64", [], 25, 33)}, bytes(range(33)))

# fuzz_json_index's fixed folder (keep in sync with tests/fuzz/fuzz_json_index.cpp).
S1 = "diffusion_pytorch_model-00001-of-00002.safetensors"
S2 = "diffusion_pytorch_model-00002-of-00002.safetensors"
FUZZ_SHARDS = {S1: ["a", "b"], S2: ["c"]}

INDEX_CASES = {
    "valid": {"metadata": {"total_size": 22}, "weight_map": {"a": S1, "b": S1, "c": S2}},
    "missing_shard": {"weight_map": {"a": S1, "b": S1, "c": "diffusion_pytorch_model-00003-of-00003.safetensors"}},
    "shard_lacks_tensor": {"weight_map": {"a": S1, "b": S1, "c": S2, "d": S2}},
    "tensor_not_in_map": {"weight_map": {"a": S1, "c": S2}},
    "tensor_in_wrong_shard": {"weight_map": {"a": S1, "b": S2, "c": S2}},
    "orphan_shard": {"weight_map": {"a": S1, "b": S1}},
    "no_weight_map": {"metadata": {}},
    "weight_map_not_object": {"weight_map": [S1, S2]},
    "entry_not_string": {"weight_map": {"a": 1, "b": S1, "c": S2}},
    "path_traversal": {"weight_map": {"a": "../" + S1, "b": S1, "c": S2}},
    "dot_dot": {"weight_map": {"a": "..", "b": S1, "c": S2}},
    "dot": {"weight_map": {"a": ".", "b": S1, "c": S2}},
    "index_as_shard": {"weight_map": {"a": "diffusion_pytorch_model.safetensors.index.json"}},
    "not_object": [1, 2],
}
INDEX_TEXT_CASES = {
    "duplicate_key": '{"weight_map":{"a":"%s","a":"%s","b":"%s","c":"%s"}}' % (S1, S2, S1, S2),
    "duplicate_top": '{"weight_map":{},"weight_map":{"a":"%s","b":"%s","c":"%s"}}' % (S1, S1, S2),
    "not_json": '{"weight_map": {"a": ',
}


# Hostile config.json files beside a checkpoint of one block of each kind (tensor names
# only: the refusal must come before any shape is compared or byte read).
# name -> (config, tensor names, text the error must contain)
FLUX1 = {"_class_name": "FluxTransformer2DModel", "num_attention_heads": 2, "attention_head_dim": 16,
         "num_layers": 1, "num_single_layers": 1, "in_channels": 16, "joint_attention_dim": 32,
         "pooled_projection_dim": 32, "axes_dims_rope": [4, 6, 6]}
FLUX_NAMES = ["transformer_blocks.0.attn.to_q.weight", "single_transformer_blocks.0.proj_out.weight", "x_embedder.weight"]
T5 = {"architectures": ["T5EncoderModel"], "model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_heads": 4,
      "num_layers": 1, "vocab_size": 128}
CLIP = {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 128}
VAE = {"_class_name": "AutoencoderKL", "block_out_channels": [8, 16], "layers_per_block": 1, "norm_num_groups": 4}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 128}
MISTRAL3 = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
            "text_config": {"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                            "num_hidden_layers": 1, "vocab_size": 128}}

QWEN_IMAGE = {"_class_name": "QwenImageTransformer2DModel", "num_layers": 1, "num_attention_heads": 2,
              "attention_head_dim": 32, "in_channels": 16, "out_channels": 4, "joint_attention_dim": 32,
              "axes_dims_rope": [8, 12, 12]}
# The hub's flat (transformers 4.x) layout of Qwen-Image's text encoder config.
QWEN2_5_VL = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 32,
              "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "vocab_size": 128, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
QWEN_VAE = {"_class_name": "AutoencoderKLQwenImage", "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2],
            "num_res_blocks": 1}

WAN = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 2,
       "attention_head_dim": 12, "in_channels": 4, "out_channels": 4, "text_dim": 16, "freq_dim": 16, "ffn_dim": 32,
       "num_layers": 1}
WAN_NAMES = ["blocks.0.attn1.to_q.weight", "patch_embedding.weight"]


def with_(config, **changes):
    out = json.loads(json.dumps(config))
    for k, v in changes.items():
        if "__" in k:
            outer, inner = k.split("__")
            out[outer][inner] = v
        else:
            out[k] = v
    return out


CONFIG_CASES = {
    "config_flux_single_layers_2e9": (with_(FLUX1, num_single_layers=2000000000), FLUX_NAMES,
                                      "num_single_layers' is 2000000000 but"),
    "config_flux_layers_1000": (with_(FLUX1, num_layers=1000), FLUX_NAMES, "num_layers' is 1000 but"),
    "config_class_name_number": (with_(FLUX1, _class_name=5), FLUX_NAMES, "_class_name is not a string (found 5)"),
    "config_flux_heads_2e62": (with_(FLUX1, num_attention_heads=1 << 62), FLUX_NAMES, "num_attention_heads"),
    "config_flux2_single_layers_2e9": (
        {"_class_name": "Flux2Transformer2DModel", "num_layers": 1, "num_single_layers": 2000000000},
        FLUX_NAMES, "num_single_layers' is 2000000000 but"),
    "config_t5_layers_2e9": (with_(T5, num_layers=2000000000), ["encoder.block.0.layer.0.SelfAttention.q.weight",
                                                                "shared.weight"], "num_layers' is 2000000000 but"),
    "config_t5_heads_2e62": (with_(T5, num_heads=1 << 62), ["encoder.block.0.layer.0.SelfAttention.q.weight"],
                             "num_heads"),
    "config_clip_layers_2e9": (with_(CLIP, num_hidden_layers=2000000000),
                               ["text_model.encoder.layers.0.mlp.fc1.weight"], "num_hidden_layers' is 2000000000 but"),
    "config_vae_layers_per_block": (with_(VAE, layers_per_block=60),
                                    ["encoder.down_blocks.0.resnets.0.conv1.weight",
                                     "encoder.down_blocks.1.resnets.0.conv1.weight",
                                     "decoder.up_blocks.0.resnets.0.conv1.weight",
                                     "decoder.up_blocks.0.resnets.1.conv1.weight"], "layers_per_block' is 60 but"),
    "config_qwen3_layers_1000": (with_(QWEN3, num_hidden_layers=1000), ["model.layers.0.mlp.up_proj.weight"],
                                 "num_hidden_layers' is 1000 but"),
    "config_mistral3_layers_2e9": (with_(MISTRAL3, text_config__num_hidden_layers=2000000000),
                                   ["language_model.model.layers.0.mlp.up_proj.weight"],
                                   "num_hidden_layers' is 2000000000 but"),
    "config_qwen_image_layers_1000": (with_(QWEN_IMAGE, num_layers=1000),
                                      ["transformer_blocks.0.attn.to_q.weight", "img_in.weight"],
                                      "num_layers' is 1000 but"),
    "config_qwen2_5_vl_layers_2e9": (with_(QWEN2_5_VL, num_hidden_layers=2000000000),
                                     ["model.layers.0.mlp.up_proj.weight"], "num_hidden_layers' is 2000000000 but"),
    "config_qwen_vae_res_blocks_60": (with_(QWEN_VAE, num_res_blocks=60),
                                      ["decoder.up_blocks.0.resnets.0.residual.0.gamma",
                                       "decoder.up_blocks.0.resnets.1.residual.0.gamma"],
                                      "num_res_blocks' is 60 but"),
    "config_wan_layers_2e9": (with_(WAN, num_layers=2000000000), WAN_NAMES, "num_layers' is 2000000000 but"),
    "config_wan_heads_2e62": (with_(WAN, num_attention_heads=1 << 62), WAN_NAMES, "num_attention_heads"),
    "config_wan_patch_4d": (with_(WAN, patch_size=[1, 2, 2, 2]), WAN_NAMES, "field 'patch_size' must"),
    "config_wan_patch_2e9": (with_(WAN, patch_size=[1, 2000000000, 2]), WAN_NAMES, "patch_size"),
    "config_wan_head_dim_odd": (with_(WAN, attention_head_dim=11), WAN_NAMES, "'attention_head_dim' = 11 must be even"),
    "config_wan_rope_2e9": (with_(WAN, rope_max_seq_len=2000000000), WAN_NAMES, "rope_max_seq_len"),
}


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def make_corpus(out):
    for name, (data, _) in FILE_CASES.items():
        write(os.path.join(out, "safetensors", name), data)
    write(os.path.join(out, "safetensors", "valid"), VALID)
    for name, idx in INDEX_CASES.items():
        write(os.path.join(out, "json_index", name + ".json"), json.dumps(idx, indent=1))
    for name, text in INDEX_TEXT_CASES.items():
        write(os.path.join(out, "json_index", name + ".json"), text)
    # fuzz_model_config: config.json, a line "--", tensor names one per line.
    valid = {"valid_flux": (FLUX1, FLUX_NAMES), "valid_t5": (T5, ["encoder.block.0.layer.0.SelfAttention.q.weight"]),
             "valid_mistral3": (MISTRAL3, ["language_model.model.layers.0.mlp.up_proj.weight"])}
    for name, (config, names, *_) in list(CONFIG_CASES.items()) + list(valid.items()):
        write(os.path.join(out, "model_config", name), json.dumps(config) + "\n--\n" + "\n".join(names) + "\n")


def folder(out, name, files):
    for fname, data in files.items():
        write(os.path.join(out, name, fname), data)
    return os.path.join(out, name)


def make_cli(out):
    rows = []
    for name, (data, needle) in FILE_CASES.items():
        path = os.path.join(out, name + ".safetensors")
        write(path, data)
        rows.append((name, path, needle or "-"))
    # The same bytes as the only weight file of a component folder.
    rows.append(("folder_truncated_body",
                 folder(out, "folder_truncated_body",
                        {"config.json": "{}",
                         "diffusion_pytorch_model.safetensors": FILE_CASES["truncated_body"][0]}), "w"))

    def shard(names, dtype="F32"):
        header = {n: t(dtype, [1], 4 * i, 4 * i + 4) for i, n in enumerate(names)}
        return st(header, b"\0" * (4 * len(names)))

    idx_name = "diffusion_pytorch_model.safetensors.index.json"

    def sharded(name, weight_map, shards, needle):
        files = {"config.json": "{}", idx_name: json.dumps({"weight_map": weight_map})}
        files.update({s: shard(ns) for s, ns in shards.items()})
        rows.append((name, folder(out, name, files), needle))

    sharded("index_missing_shard", {"a": S1, "b": S1, "c": S2}, {S1: ["a", "b"]}, "c")
    sharded("index_shard_lacks_tensor", {"a": S1, "b": S1, "c": S2, "d": S2}, FUZZ_SHARDS, "d")
    sharded("index_tensor_not_in_map", {"a": S1, "c": S2}, FUZZ_SHARDS, "b")
    sharded("index_tensor_in_two_shards", {"a": S1, "b": S1, "c": S2}, {S1: ["a", "b"], S2: ["b", "c"]}, "b")
    sharded("index_orphan_shard", {"a": S1, "b": S1}, FUZZ_SHARDS, S2)
    files = {"config.json": "{}", idx_name: json.dumps({"weight_map": {"a": S1, "c": S2}}),
             S1: FILE_CASES["overlapping_offsets"][0], S2: shard(["c"])}
    rows.append(("index_hostile_shard", folder(out, "index_hostile_shard", files), "b"))
    files = {"config.json": "{}", idx_name: INDEX_TEXT_CASES["duplicate_key"],
             S1: shard(["a", "b"]), S2: shard(["c"])}
    rows.append(("index_duplicate_key", folder(out, "index_duplicate_key", files), "'a' twice"))

    pickle = b"\x80\x02}q\x00."  # an empty dict, pickled
    for ext in ("bin", "pt", "ckpt"):
        path = os.path.join(out, "pickle." + ext)
        write(path, pickle)
        rows.append(("pickle_" + ext, path, "safetensors"))
    rows.append(("pickle_folder",
                 folder(out, "pickle_folder", {"config.json": "{}", "diffusion_pytorch_model.bin": pickle}),
                 "diffusion_pytorch_model.bin"))
    # A good plain file beside a hostile fp16 variant: only --variant fp16 reads the latter.
    good = st({"w": t("F32", [1], 0, 4)}, b"\0" * 4)
    rows.append(("variant_fp16_truncated",
                 folder(out, "variant_fp16_truncated",
                        {"config.json": "{}", "diffusion_pytorch_model.safetensors": good,
                         "diffusion_pytorch_model.fp16.safetensors": FILE_CASES["truncated_body"][0]}),
                 "diffusion_pytorch_model.fp16.safetensors", "--variant fp16"))
    rows.append(("json_tp2_truncated", os.path.join(out, "truncated_body.safetensors"), "w", "--json --tp 2"))
    for name, (config, names, needle) in CONFIG_CASES.items():
        rows.append((name, folder(out, name, {"config.json": json.dumps(config, indent=1),
                                              "model.safetensors": shard(names)}), needle))
    write(os.path.join(out, "valid.safetensors"), VALID)
    with open(os.path.join(out, "cases.tsv"), "w") as f:
        for row in rows:
            row = tuple(row) + ("-",) * (4 - len(row))
            f.write("\t".join(row) + "\n")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("corpus", "cli"):
        sys.exit(__doc__)
    (make_corpus if sys.argv[1] == "corpus" else make_cli)(sys.argv[2])


if __name__ == "__main__":
    main()
