"""Every equation the site shows, declared once: id, page, title, LaTeX.

Source lines that compute an equation carry a comment marker `# eq:<id>`
(see site_scripts/markers.py). The build ties the two together and fails when
an equation has no implementing line or a marker names no equation here.
"""

from dataclasses import dataclass

from .registry import PAGE_PATHS


@dataclass(frozen=True)
class Equation:
    id: str  # stable anchor, also the marker name: # eq:<id>
    page: str  # the page that explains it (an id of site_scripts/registry.py)
    title: str
    latex: str


EQUATIONS = [
    # Embeddings
    Equation("embed", "embeddings", "Token plus position embedding",
             r"X_{b,t} = E_{\mathrm{tok}}[\mathrm{id}_{b,t}] + E_{\mathrm{pos}}[t]"),
    Equation("embed-grad", "embeddings", "Scatter-add of the embedding gradient",
             r"\frac{\partial \ell}{\partial E_{\mathrm{tok}}[v]} = \sum_{b,t\,:\,\mathrm{id}_{b,t} = v}"
             r" \frac{\partial \ell}{\partial X_{b,t}}"),
    # Linear, activations, initialisation
    Equation("linear", "linear", "Affine layer", r"Y = X W + \mathbf{1} b^\top"),
    Equation("linear-grad", "linear", "Affine layer, backward",
             r"\frac{\partial \ell}{\partial X} = \frac{\partial \ell}{\partial Y} W^\top,\quad"
             r"\frac{\partial \ell}{\partial W} = X^\top \frac{\partial \ell}{\partial Y},\quad"
             r"\frac{\partial \ell}{\partial b} = \sum_{\text{rows}} \frac{\partial \ell}{\partial Y}"),
    Equation("relu", "linear", "ReLU", r"\operatorname{ReLU}(x) = \max(0, x)"),
    Equation("relu-grad", "linear", "ReLU, backward",
             r"\frac{\partial \ell}{\partial x} = \frac{\partial \ell}{\partial y}\,[x > 0]"),
    Equation("gelu", "linear", "GELU (exact)",
             r"\operatorname{GELU}(x) = x\,\Phi(x) = \tfrac{x}{2}\left(1 + \operatorname{erf}(x/\sqrt{2})\right)"),
    Equation("gelu-grad", "linear", "GELU, backward",
             r"\frac{\partial \ell}{\partial x} = \frac{\partial \ell}{\partial y}"
             r"\left(\Phi(x) + x\,\varphi(x)\right),\quad \varphi(x) = \tfrac{1}{\sqrt{2\pi}} e^{-x^2/2}"),
    Equation("xavier", "linear", "Xavier-uniform initialisation",
             r"W_{ij} \sim \mathcal{U}\!\left(-a, a\right),\quad a = \sqrt{\frac{6}{n_{\mathrm{in}} + n_{\mathrm{out}}}}"),
    # LayerNorm
    Equation("ln-mean", "layernorm", "Row mean", r"\mu = \frac{1}{d} \sum_{i=1}^{d} x_i"),
    Equation("ln-var", "layernorm", "Row variance (population)",
             r"\sigma^2 = \frac{1}{d} \sum_{i=1}^{d} (x_i - \mu)^2"),
    Equation("ln-norm", "layernorm", "Normalised row", r"\hat{x}_i = \frac{x_i - \mu}{\sqrt{\sigma^2 + \epsilon}}"),
    Equation("ln-affine", "layernorm", "Gain and shift", r"y_i = g_i\,\hat{x}_i + b_i"),
    Equation("ln-grad", "layernorm", "LayerNorm, backward (three terms)",
             r"\frac{\partial \ell}{\partial x_i} = \frac{1}{\sqrt{\sigma^2+\epsilon}}\left("
             r"\delta_i - \frac{1}{d}\sum_j \delta_j - \hat{x}_i\,\frac{1}{d}\sum_j \delta_j \hat{x}_j\right),"
             r"\quad \delta_i = g_i \frac{\partial \ell}{\partial y_i}"),
    Equation("ln-grad-params", "layernorm", "LayerNorm, backward to the gain and shift",
             r"\frac{\partial \ell}{\partial g_i} = \sum_{\text{rows}} \frac{\partial \ell}{\partial y_i}\,\hat{x}_i,"
             r"\quad \frac{\partial \ell}{\partial b_i} = \sum_{\text{rows}} \frac{\partial \ell}{\partial y_i}"),
    # Softmax and cross-entropy
    Equation("softmax", "softmax", "Stable softmax",
             r"p_i = \frac{e^{z_i - \max_k z_k}}{\sum_j e^{z_j - \max_k z_k}}"),
    Equation("softmax-grad", "softmax", "Softmax, backward",
             r"\frac{\partial \ell}{\partial z_i} = p_i\left(\frac{\partial \ell}{\partial p_i}"
             r" - \sum_j \frac{\partial \ell}{\partial p_j} p_j\right)"),
    Equation("xent", "softmax", "Mean cross-entropy from logits",
             r"\mathcal{L} = \frac{1}{N} \sum_{n=1}^{N} \left(\log \sum_j e^{z_{n,j}} - z_{n, y_n}\right)"),
    Equation("xent-grad", "softmax", "Cross-entropy, backward",
             r"\frac{\partial \mathcal{L}}{\partial z_{n,j}} = \frac{1}{N}\left(p_{n,j} - [j = y_n]\right)"),
    # Attention
    Equation("attn-qkv", "attention", "Queries, keys, values",
             r"Q = X W_q + b_q,\quad K = X W_k + b_k,\quad V = X W_v + b_v"),
    Equation("attn-scores", "attention", "Scaled scores, per head",
             r"S^{(h)} = \frac{Q^{(h)} K^{(h)\top}}{\sqrt{d_h}}"),
    Equation("attn-mask", "attention", "Causal mask",
             r"S^{(h)}_{ts} \leftarrow -\infty \quad \text{for } s > t"),
    Equation("attn-softmax", "attention", "Attention weights", r"A^{(h)} = \operatorname{softmax}_{\text{rows}}(S^{(h)})"),
    Equation("attn-mix", "attention", "Weighted values", r"O^{(h)} = A^{(h)} V^{(h)}"),
    Equation("attn-out", "attention", "Heads joined and projected",
             r"\operatorname{Attn}(X) = [O^{(1)} \cdots O^{(H)}]\, W_o + b_o"),
    Equation("attn-grad-mix", "attention", "Backward through the weighted values",
             r"\frac{\partial \ell}{\partial A^{(h)}} = \frac{\partial \ell}{\partial O^{(h)}} V^{(h)\top},\quad"
             r"\frac{\partial \ell}{\partial V^{(h)}} = A^{(h)\top} \frac{\partial \ell}{\partial O^{(h)}}"),
    Equation("attn-grad-qk", "attention", "Backward through the scores",
             r"\frac{\partial \ell}{\partial Q^{(h)}} = \frac{1}{\sqrt{d_h}} \frac{\partial \ell}{\partial S^{(h)}} K^{(h)},"
             r"\quad \frac{\partial \ell}{\partial K^{(h)}} = \frac{1}{\sqrt{d_h}}"
             r" \left(\frac{\partial \ell}{\partial S^{(h)}}\right)^{\!\top} Q^{(h)}"),
    # Block
    Equation("block-attn-residual", "block", "Attention sub-layer",
             r"M = X + \operatorname{Attn}(\operatorname{LN}_1(X))"),
    Equation("ffn", "block", "Feed-forward network",
             r"\operatorname{FFN}(U) = \phi(U W_1 + b_1)\, W_2 + b_2"),
    Equation("block-ffn-residual", "block", "Feed-forward sub-layer",
             r"Y = M + \operatorname{FFN}(\operatorname{LN}_2(M))"),
    Equation("block-residual-grad", "block", "The residual passes the gradient through",
             r"\frac{\partial \ell}{\partial M} = \frac{\partial \ell}{\partial Y}"
             r" + \frac{\partial \ell}{\partial Y}\frac{\partial\, \operatorname{FFN}(\operatorname{LN}_2(M))}{\partial M},"
             r"\quad \frac{\partial \ell}{\partial X} = \frac{\partial \ell}{\partial M}"
             r" + \frac{\partial \ell}{\partial M}\frac{\partial\, \operatorname{Attn}(\operatorname{LN}_1(X))}{\partial X}"),
    # Full model
    Equation("head", "model", "The head", r"Z = \operatorname{LN}_f(X^{(L)})\, W_h + b_h"),
    Equation("param-count", "model", "Number of scalars",
             r"N = 2Vd + T_{\max} d + 2d + V + L\,(4d^2 + 2dF + 9d + F)"),
    # Optimisation
    Equation("adamw-decay", "optim", "Decoupled weight decay", r"\theta \leftarrow \theta\,(1 - \eta \lambda)"),
    Equation("adam-moments", "optim", "Moment estimates",
             r"m \leftarrow \beta_1 m + (1 - \beta_1) g,\quad v \leftarrow \beta_2 v + (1 - \beta_2) g^2"),
    Equation("adam-bias-correction", "optim", "Bias correction",
             r"\hat{m} = \frac{m}{1 - \beta_1^t},\quad \hat{v} = \frac{v}{1 - \beta_2^t}"),
    Equation("adam-update", "optim", "The update", r"\theta \leftarrow \theta - \eta\,\frac{\hat{m}}{\sqrt{\hat{v}} + \epsilon}"),
    Equation("lr-warmup", "optim", "Linear warm-up", r"\eta_s = \eta_{\max}\,\frac{s + 1}{S_w}\quad (s < S_w)"),
    Equation("lr-cosine", "optim", "Cosine decay",
             r"\eta_s = \eta_{\min} + \tfrac{1}{2}(\eta_{\max} - \eta_{\min})"
             r"\left(1 + \cos\frac{\pi (s - S_w)}{S - S_w}\right)"),
    Equation("clip", "optim", "Global-norm clipping",
             r"g \leftarrow g \cdot \frac{c}{\lVert g \rVert + 10^{-6}} \quad \text{if } \lVert g \rVert > c"),
    # Training data
    Equation("next-token", "training", "Targets are the inputs shifted by one",
             r"x_{b,t} = c_{s_b + t},\quad y_{b,t} = c_{s_b + t + 1},\quad s_b \sim \mathcal{U}\{0, \ldots, N - T - 1\}"),
    # Sampling and the KV cache
    Equation("sample-temperature", "sampling", "Temperature",
             r"P(v) = \frac{e^{(z_v - \max_k z_k)/\tau}}{\sum_j e^{(z_j - \max_k z_k)/\tau}},\quad"
             r"\tau = 0 \Rightarrow \arg\max_v z_v"),
    Equation("sample-topk", "sampling", "Top-k",
             r"z_v \leftarrow -\infty \quad \text{if } z_v < z_{(k)} \text{ (the } k\text{-th largest logit)}"),
    Equation("kv-append", "kvcache", "Append the new position's key and value",
             r"K_{0:t} = [K_{0:t-1};\, k_t],\quad V_{0:t} = [V_{0:t-1};\, v_t]"),
    Equation("kv-attend", "kvcache", "Attend from the new position only",
             r"o_t = \operatorname{softmax}\!\left(\frac{q_t K_{0:t}^\top}{\sqrt{d_h}}\right) V_{0:t}"),
    # Verification
    Equation("central-diff", "gradcheck", "Central differences",
             r"\frac{\partial f}{\partial x_i} \approx \frac{f(x + h e_i) - f(x - h e_i)}{2h}"),
]

BY_ID = {eq.id: eq for eq in EQUATIONS}
if len(BY_ID) != len(EQUATIONS):
    raise RuntimeError("an equation id is declared twice in site_scripts/equations.py")
if {eq.page for eq in EQUATIONS} - set(PAGE_PATHS):
    raise RuntimeError(f"equations name pages not in site_scripts/registry.py: "
                       f"{sorted({eq.page for eq in EQUATIONS} - set(PAGE_PATHS))}")
