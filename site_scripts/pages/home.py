"""Generator of the Home page's fragments: the model's dataflow with the shapes
of a real forward pass, and what this build checked."""

from .. import sections
from ..equations import all_equations
from ..examples import SEED, default_run, sizes
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


def checked_md():
    markers, equations = collect_markers(), all_equations()
    page_of = {eq.id: eq.page for eq in equations}
    report = crosscheck_report()
    checked = [d for d in report["devices"] if d["status"] == "checked"]
    missing = [d["device"] for d in report["devices"] if d["status"] != "checked"]
    device_text = "; ".join(f"{d['device']} ({d['dtype']}): {d['checks']} comparisons, "
                            + ("all pass" if d["passed"] else "**some FAIL**") for d in checked)
    pages = sorted({eq.page for eq in equations}, key=list(PAGE_PATHS).index)
    rows = [[f"[{sections.page_title(p)}]({sections.page_link(PAGE, p)})",
             sum(eq.page == p for eq in equations),
             sum(page_of.get(m.eq_id) == p for m in markers)] for p in pages]
    return (f"This build tied **{len(equations)} equations** to **{len(markers)} lines** of `transformer/`, and "
            f"compared the NumPy reference with PyTorch {report['versions']['torch']} on {device_text}"
            + (f" ({', '.join(missing)}: not on the build machine)" if missing else "") + ".\n\n"
            + sections.md_table(["Page", "Equations", "Lines computing them"], rows))


def generate(context):
    from transformer.data import TRAIN_FRACTION

    return {"values": {"train_share": TRAIN_FRACTION}, "dataflow": dataflow_md(), "checked": checked_md(),
            "provenance": sections.provenance_md(PAGE, {"ids": SEED})}
