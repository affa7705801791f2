"""Generator of "The same model as GPT-2" page: the layout switches, the checkpoint's names, and the model in
GPT-2's layout against transformers' GPT2LMHeadModel, layer by layer, at random initialisation in float64.

Both models hold the same numbers: a GPT2LMHeadModel is made at random, every tensor moved off its initial
value (biases start at zero and gains at one, where a wrong term can hide), and `gpt2.from_hf` reads our
parameters from its state. Our side of each row is the model's own trace, or the layer function that
`block_forward` calls on the traced input where the trace keeps no such tensor (the attention's and the
feed-forward network's outputs before their residual additions).
"""

import os

import numpy as np

from transformer.activations import gelu_tanh_forward
from transformer.attention import attention_forward
from transformer.block import block_params
from transformer.bpe import GPT2Tokenizer
from transformer.config import GPT2_LAYOUT, PRESETS
from transformer.crosscheck import Row, discover_devices, run_crosscheck
from transformer.crosscheck_report import GRADIENT_COLUMNS, engine_rows
from transformer.generate import KVCache, decode_step
from transformer.generate import generate as generate_tokens
from transformer.gpt2 import from_hf, hf_names, load_gpt2, to_hf
from transformer.kv_cache import PagedCache, PagePool
from transformer.linear import linear_forward
from transformer.model import forward, loss_and_grads, param_count, param_shapes

from .. import gpt2_cost as cost
from ..common import md_table, verdict_text
from ..examples import SEED

TOL = 1e-12  # float64: two orders of the same sums agree to about 1e-15 relative
# GPT-2's vocabulary and layout at a width the build can afford: every id the tokenizer makes is valid.
CFG = PRESETS["gpt2"].with_(context_len=32, emb_dim=48, num_heads=4, num_layers=2, ff_dim=192)
TEXT = "Now is the winter of our discontent made glorious summer"
MOVE = 0.1  # every tensor of the random GPT-2 moves by MOVE times a standard normal draw
CHECKPOINT_ENV = "GPT2_CHECKPOINT"  # a folder with GPT-2's real weights, if the build machine has one
REAL_TOKENS = 20  # tokens the real weights continue the text by


def hf_gpt2(cfg, device="cpu"):
    """transformers' GPT2LMHeadModel of cfg's sizes, in float64 on device, moved off its initial values."""
    import torch
    import transformers

    hc = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_len, n_embd=cfg.emb_dim,
                                 n_layer=cfg.num_layers, n_head=cfg.num_heads, n_inner=cfg.ff_dim,
                                 layer_norm_epsilon=cfg.ln_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(SEED)
    model = transformers.GPT2LMHeadModel(hc).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(MOVE * torch.randn_like(p))
    return model.to(device)


def hf_intermediates(model, ids):
    """transformers' tensors at each point this page compares, recorded by forward hooks, and its logits."""
    import torch

    seen, hooks = {}, []
    blocks = model.transformer.h

    def keep(name, index=None):
        return lambda module, args, out: seen.__setitem__(name, (out[0] if index == 0 else out).detach())

    for l, block in enumerate(blocks):
        hooks += [block.ln_1.register_forward_hook(keep(f"b{l}.ln1")),
                  block.attn.register_forward_hook(keep(f"b{l}.attn_out", 0)),
                  block.ln_2.register_forward_hook(keep(f"b{l}.ln2")),
                  block.mlp.register_forward_hook(keep(f"b{l}.ffn_out")),
                  block.register_forward_hook(keep(f"b{l}.out", 0))]
    hooks.append(model.transformer.ln_f.register_forward_hook(keep("lnf")))
    out = model(torch.as_tensor(ids, device=model.device), output_hidden_states=True)
    for h in hooks:
        h.remove()
    seen["embedding"] = out.hidden_states[0].detach()
    for l in range(len(blocks)):
        seen[f"b{l}.mid"] = seen[f"b{l - 1}.out" if l else "embedding"] + seen[f"b{l}.attn_out"]
    seen["logits"] = out.logits.detach()
    return {k: v.cpu().numpy() for k, v in seen.items()}, out.logits


def our_intermediates(params, ids, cfg):
    """The same points from our model: its trace, and the layer functions block_forward calls where the trace
    keeps no tensor."""
    trace = {}
    forward(params, ids, cfg, trace)
    ours = dict(trace)
    for l in range(cfg.num_layers):
        p, x = block_params(params, l), trace[f"b{l - 1}.out" if l else "embedding"]
        ours[f"b{l}.attn_out"] = attention_forward(trace[f"b{l}.ln1"], p, cfg.num_heads)[0]
        ours[f"b{l}.mid"] = x + ours[f"b{l}.attn_out"]
        hidden = gelu_tanh_forward(linear_forward(trace[f"b{l}.ln2"], p["ff1_w"], p["ff1_b"])[0])[0]
        ours[f"b{l}.ffn_out"] = linear_forward(hidden, p["ff2_w"], p["ff2_b"])[0]
    return ours


def row(what, ours, theirs):
    """A row of the comparison: the largest relative gap (over the largest entry of transformers' tensor) and
    the share of entries within TOL of it, relative to that largest entry."""
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    scale = max(float(np.abs(theirs).max()), np.finfo(float).tiny)
    gaps = np.abs(ours - theirs) / scale
    return {"what": what, "shape": ours.shape, "gap": float(gaps.max()), "share": float((gaps <= TOL).mean()),
            "passed": bool(gaps.max() <= TOL)}


def layer_rows(params, model, ids, cfg):
    import torch

    theirs, logits = hf_intermediates(model, ids)
    ours = our_intermediates(params, ids, cfg)
    names = ["embedding"]
    for l in range(cfg.num_layers):
        names += [f"b{l}.{k}" for k in ("ln1", "attn_out", "mid", "ln2", "ffn_out", "out")]
    rows = [row(n, ours[n], theirs[n]) for n in names + ["lnf", "logits"]]
    targets = np.roll(ids, -1, axis=-1)
    hf_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                                torch.as_tensor(targets, device=logits.device).reshape(-1))
    hf_loss.backward()
    loss, grads = loss_and_grads(params, ids, targets, cfg)
    rows.append(row("loss", loss, hf_loss.item()))
    hf_grads = {k: v.grad.cpu().numpy() for k, v in model.named_parameters()}
    grad_rows = [row(name, g, hf_grads[name]) for name, g in to_hf(grads, cfg).items()]
    return rows, grad_rows


def decoding_rows(params, model, ids, cfg):
    """Greedy decoding from the text's first ids: transformers' generate against ours, whose tokens come from
    the contiguous KV cache (`generate`); and each step's logits from the contiguous and the paged cache against
    transformers' forward over the whole sequence (its generate rounds the logits it hands back to float32)."""
    import torch

    prompt, new = list(ids[0][:4]), cfg.context_len - 4
    sequence = model.generate(torch.as_tensor([prompt], device=model.device), max_new_tokens=new, do_sample=False,
                              pad_token_id=0)
    hf_tokens = sequence[0].tolist()[len(prompt):]
    with torch.no_grad():
        hf_logits = model(sequence).logits[0, len(prompt) - 1:-1].cpu().numpy()
    tokens = generate_tokens(params, cfg, prompt, new, temperature=0.0)
    rows = []
    for name, cache in (("contiguous", KVCache(cfg, np.float64)),
                        ("paged", PagedCache(PagePool(cfg, 8, 5, np.float64), cfg.context_len))):
        logits = [decode_step(params, t, cache, cfg) for t in prompt + hf_tokens[:-1]]
        rows.append(row(f"decoding logits, {name} cache", np.stack(logits[len(prompt) - 1:]), hf_logits))
    same = verdict_text(list(tokens) == hf_tokens, False, "")
    return rows, {"tokens": list(tokens), "hf_tokens": hf_tokens, "same": same, "new": new, "prompt": prompt}


def table(rows):
    return md_table(["compared", "shape", "largest relative gap", f"entries within {TOL:g}", "verdict"],
                    [[f"`{r['what']}`", f"`{r['shape']}`", f"{r['gap']:.1e}", f"{r['share']:.0%}",
                      verdict_text(r["passed"], False, "")] for r in rows])


def devices(ids):
    """Every row on each torch device present that has float64; the others listed (the cross-check page says
    why each is missing)."""
    found, missing, results = [], [], {}
    for name, torch_device, dtype, reason in discover_devices():
        if torch_device is None or dtype != "float64":
            missing.append(name)
            continue
        model = hf_gpt2(CFG, torch_device)
        ours = from_hf({k: v.cpu().numpy() for k, v in model.state_dict().items()}, CFG)
        results[name] = (layer_rows(ours, model, ids, CFG), decoding_rows(ours, model, ids, CFG))
        found.append(name)
    return found, missing, results


def crosscheck_table():
    """`python -m transformer crosscheck` in GPT-2's layout on the devices present: per device, the largest
    relative gap in each column of its gradients' table (the rows that pass on the absolute bound, gradients zero
    in exact arithmetic, left out), then transformers' logits and loss, and the device's verdict."""
    report = run_crosscheck(**GPT2_LAYOUT)
    engine = [r for r in engine_rows(report).values() if not r.on_floor]
    rows = []
    for d in (d for d in report["devices"] if d["status"] == "checked"):
        mine = [Row(**r) for r in report["rows"] if r["device"] == d["device"]]
        gaps = [max(r.max_rel for r in (engine if check is None else mine) if not r.on_floor
                    and (check is None or r.check == check)) for _, check in GRADIENT_COLUMNS]
        hf = [r for r in mine if r.check == "transformers"]
        rows.append([d["device"], d["dtype"], *(f"{g:.1e}" for g in gaps), f"{max(r.max_rel for r in hf):.1e}",
                     f"{d['checks']} comparisons, " + verdict_text(d["passed"], False, "")])
    header = ["device", "dtype", *(name.replace("HF", "transformers") for name, _ in GRADIENT_COLUMNS),
              "logits and loss vs transformers", "the whole cross-check"]
    gradients = sum(r["check"] == "transformers gradient" for r in report["rows"]) // max(len(rows), 1)
    floor = sorted({r.tensor for r in map(lambda d: Row(**d), report["rows"])
                    if r.check in ("gradient", "autograd", "transformers gradient") and r.on_floor}
                   | {r.tensor for r in engine_rows(report).values() if r.on_floor})
    return md_table(header, rows), gradients, report["config"], floor


def names_table():
    """Hugging Face's names for one block and the tensors outside the blocks, ours beside them, with GPT-2 small's
    shapes."""
    shapes = param_shapes(PRESETS["gpt2"])
    rows = []
    for hf, ours in hf_names(PRESETS["gpt2"]).items():
        if hf.startswith("h.") and not hf.startswith("h.0."):
            continue
        shape = shapes[ours[0]][:-1] + (sum(shapes[o][-1] for o in ours),)
        rows.append([f"`{hf}`", f"`{shape}`", ", ".join(f"`{o}`" for o in ours)])
    return md_table(["Hugging Face tensor (`transformer.` before it)", "shape in GPT-2 small", "ours"], rows)


def real_weights():
    """GPT-2's real weights, if $GPT2_CHECKPOINT names a folder: a greedy continuation of the text, as a table."""
    folder = os.environ.get(CHECKPOINT_ENV)
    if not folder:
        rows = [["not on this build machine", "(none)"]]
    else:
        params, cfg = load_gpt2(folder)
        tok = GPT2Tokenizer()
        new = generate_tokens(params, cfg, tok.encode(TEXT), REAL_TOKENS, temperature=0.0)
        rows = [[f"`{folder}` ({param_count(cfg)} parameters)", f"`{TEXT + tok.decode(new)!r}`"]]
    return md_table(["GPT-2's weights", f"greedy continuation, {REAL_TOKENS} tokens"], rows)


def generate(context):
    tok = GPT2Tokenizer()
    ids = tok.encode(TEXT)[None]
    found, missing, results = devices(ids)
    (rows, grad_rows), (decode_rows, decoding) = results["cpu"]
    everything = rows + grad_rows + decode_rows
    values = {"tol": TOL, "move": MOVE, "text": repr(TEXT), "tokens": ids.shape[1], "vocab": CFG.vocab_size,
              "d": CFG.emb_dim, "heads": CFG.num_heads, "layers": CFG.num_layers, "ff": CFG.ff_dim,
              "worst": max(r["gap"] for r in everything), "all_pass": verdict_text(all(r["passed"] for r in everything), False, ""),
              "grads": len(grad_rows), "worst_grad": max(r["gap"] for r in grad_rows), "decoding": decoding,
              "found": found, "missing": missing or ["none"], "layout": [f"`{k}={v!r}`" for k, v in GPT2_LAYOUT.items()],
              "small": param_count(PRESETS["gpt2"]), "real": {"env": CHECKPOINT_ENV}}
    cross, cross_grads, cross_cfg, cross_floor = crosscheck_table()
    cost_md, values["cost"] = cost.tables()
    values["cross"] = {"grads": cross_grads, "d": cross_cfg["emb_dim"], "vocab": cross_cfg["vocab_size"],
                       "layers": cross_cfg["num_layers"], "floor": cross_floor}
    return {"values": values, "crosscheck": cross, **cost_md, "layers": table(rows), "gradients": table(grad_rows), "decoding": table(decode_rows),
            "names": names_table(), "real": real_weights()}

