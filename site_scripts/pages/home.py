"""Generator of the Home page's fragments: the model's dataflow with the shapes
of a real forward pass, and what this build checked."""

from .. import sections
from ..equations import all_equations
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_run, sizes
from ..markers import collect_markers
from ..registry import PAGE_PATHS
from ..results import crosscheck_report

PAGE = "home"


def shape(t):
    return "(" + ", ".join(str(n) for n in t) + ")"


def dataflow_md():
    ex = default_run()
    cfg, trace, L = ex.cfg, ex.trace, ex.cfg.num_layers
    B, T = ex.ids.shape
    nodes = [
        ("text", '"text"', "tokenizer"),
        ("ids", f'"ids {shape((B, T))}"', "tokenizer"),
        ("emb", f'"tok_emb[ids] + pos_emb[:T]<br/>X⁽⁰⁾ {shape(trace["embedding"].shape)}"', "embeddings"),
        ("ln1", f'"LN₁: U₁ {shape(trace["b0.ln1"].shape)}"', "layernorm"),
        ("att", f'"causal attention, H = {cfg.num_heads}<br/>weights {shape(trace["b0.attention"].shape)}"',
         "attention"),
        ("res1", '"M = X + Attn(U₁)"', "block"),
        ("ln2", f'"LN₂: U₂ {shape(trace["b0.ln2"].shape)}"', "layernorm"),
        ("ffn", f'"FFN: linear, {cfg.activation}, linear<br/>hidden width F = {cfg.ff_dim}"', "linear"),
        ("res2", f'"X⁽ˡ⁺¹⁾ = M + FFN(U₂) {shape(trace["b0.out"].shape)}"', "block"),
        ("lnf", f'"LN_f: X_f {shape(trace["lnf"].shape)}"', "layernorm"),
        ("head", f'"head: logits Z {shape(trace["logits"].shape)}"', "model"),
        ("loss", '"mean cross-entropy"', "softmax"),
    ]
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"  {name}[{label}]" for name, label, _ in nodes]
    lines += ["  text --> ids --> emb --> ln1",
              f'  subgraph block["block l = 0 .. {L - 1} (L = {L})"]',
              "    ln1 --> att --> res1 --> ln2 --> ffn --> res2", "  end",
              "  emb -. residual .-> res1", "  res1 -. residual .-> res2",
              "  res2 --> lnf --> head --> loss"]
    lines += [f'  click {name} href "{PAGE_PATHS[page].replace(".md", "/")}"'  # mermaid follows built URLs
              for name, _, page in nodes]
    lines.append("```")
    return ("\n".join(lines) + f"\n\nShapes from a real forward pass at the default config ({sizes(cfg)}) on a "
            f"batch of B = {B} sequences of T = {T} tokens; each box opens the page that explains it.\n")


def row_text(a, count=4):
    """The first entries of a tensor's first row (its last axis), to 4 decimals."""
    row = a.reshape(-1, a.shape[-1])[0]
    return ", ".join(sections.fixed(v) for v in row[:count]) + (", …" if row.size > count else "")


# The tiny model's forward and backward, step by step: (trace name, symbol, what it is, the page deriving it).
FORWARD = (("embedding", "X^{(0)}", "token rows plus position rows", "embeddings"),
           ("b0.ln1", "U_1", "block 0's LN1: every row to mean 0, spread 1", "layernorm"),
           ("b0.attention", r"\alpha^{(h)}", "block 0's attention weights, one row per query, causal", "attention"),
           ("b0.ln2", "U_2", "block 0's LN2, after the residual M = X + Attn(U_1)", "block"),
           ("b0.out", "X^{(1)}", "block 0's output, after the feed-forward network", "block"),
           ("lnf", "X_f", "the final LayerNorm, after the last block", "model"),
           ("logits", "Z", "the head: one score per token of the vocabulary", "model"))
BACKWARD = (("dlogits", r"\partial\ell/\partial Z", "softmax minus the one-hot target, over N", "softmax"),
            ("dlnf", r"\partial\ell/\partial X_f", "through the head's weights", "linear"),
            ("b1.dout", r"\partial\ell/\partial X^{(L)}", "through the final LayerNorm", "layernorm"),
            ("b0.dmid", r"\partial\ell/\partial M", "block 0: through the feed-forward network and LN2, plus the "
             "residual", "block"),
            ("b0.dln1", r"\partial\ell/\partial U_1", "through attention", "attention"),
            ("dembedding", r"\partial\ell/\partial X^{(0)}", "through LN1, plus the residual: what the tables "
             "receive", "embeddings"))


def story_tables():
    """The tiny example's forward and backward as two tables: each step's tensor, shape, first entries and the
    page that derives it."""
    from ..examples import tiny
    from ..tiny_backward import tiny_backward

    ex, bw = tiny(), tiny_backward()

    def rows(steps, source):
        return [[f"\\({symbol}\\)", what, sections.shape_text(source[name].shape[1:]), row_text(source[name]),
                 f"[{sections.page_title(page)}]({sections.page_link(PAGE, page)})"]
                for name, symbol, what, page in steps]
    header = ["Tensor", "What it is", "Shape", "First entries", "Derived on"]
    return (sections.md_table(header, rows(FORWARD, ex.trace)), sections.md_table(header, rows(BACKWARD, bw.steps)),
            {"loss": bw.loss, "ids": TINY_IDS, "targets": TINY_TARGETS, "seed": SEED})


def checked_md():
    markers, equations = collect_markers(), all_equations()
    page_of = {eq.id: eq.page for eq in equations}
    pages = sorted({eq.page for eq in equations}, key=list(PAGE_PATHS).index)
    rows = [[f"[{sections.page_title(p)}]({sections.page_link(PAGE, p)})",
             sum(eq.page == p for eq in equations),
             sum(page_of.get(m.eq_id) == p for m in markers)] for p in pages]
    return sections.md_table(["Page", "Equations", "Lines computing them"], rows), {
        "equations": len(equations), "lines": len(markers)}


def devices_values():
    report = crosscheck_report()
    checked = [d for d in report["devices"] if d["status"] == "checked"]
    return {"torch": report["versions"]["torch"],
            "devices": "; ".join(f"{d['device']} ({d['dtype']}): {d['checks']} comparisons, "
                                 + ("all pass" if d["passed"] else "**some FAIL**") for d in checked),
            "missing": ", ".join(d["device"] for d in report["devices"] if d["status"] != "checked") or "none"}


def generate(context):
    from transformer.data import TRAIN_FRACTION

    forward, backward, story = story_tables()
    table, counts = checked_md()
    return {"values": {"train_share": TRAIN_FRACTION, "story": story, "tiny": sizes_values(), **counts,
                       "crosscheck": devices_values()},
            "dataflow": dataflow_md(), "forward": forward, "backward": backward, "checked": table,
            "provenance": sections.provenance_md(PAGE, {"ids": SEED})}


def sizes_values():
    from transformer.config import PRESETS

    cfg = PRESETS["tiny"]
    return {"vocab": cfg.vocab_size, "context": cfg.context_len, "d": cfg.emb_dim, "heads": cfg.num_heads,
            "layers": cfg.num_layers, "ff": cfg.ff_dim}
