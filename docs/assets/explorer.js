// The explorer: the tiny model's forward, then its backward, one step at a time, every tensor a grid of its
// entries. The numbers are the build's (site_scripts/pages/explorer.py writes one data file per choice of
// sequence and seed, beside the page); nothing is computed here but colours and, in the backward, the product
// that each flow shows. Choosing an output entry marks the
// input entries its Jacobian row does not hold at zero, and in the backward shows the gradient that flows back
// to each: the output's gradient times that Jacobian entry.
(() => {
  const data = () => (window.explorerData = window.explorerData || {});

  function load(base, key) {  // a <script> tag, which a page opened from disk may load where fetch may not
    if (data()[key]) return Promise.resolve(data()[key]);
    return new Promise((resolve, reject) => {
      const tag = document.createElement("script");
      tag.src = new URL(`${base}${key}.data.js`, location.href).href;
      tag.onload = () => (data()[key] ? resolve(data()[key]) : reject(new Error(`no data in ${tag.src}`)));
      tag.onerror = () => reject(new Error(`cannot load ${tag.src}`));
      document.head.appendChild(tag);
    });
  }

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    node.append(...children);
    return node;
  }

  const grad = (symbol) => `∂ℓ/∂${symbol}`;
  const short = (v) => Number(v.toPrecision(4)).toString();  // the flows' numbers; the readout has them in full

  class Explorer {
    constructor(root) {
      this.root = root;
      this.choices = JSON.parse(root.dataset.choices);
      this.base = root.dataset.base || "";  // where the data files are, from the page's URL
      this.position = 0;  // 0 .. 2n-1: the forward's steps, then the backward's, last step first
      this.selected = null;  // the chosen output entry
      this.build();
      this.choose(root.dataset.first);
    }

    build() {
      const sequences = [...new Set(this.choices.map((c) => c.sequence))];
      const seeds = [...new Set(this.choices.map((c) => c.seed))];
      this.sequence = el("select", {"aria-label": "tokens", class: "xp-sequence"},
        ...sequences.map((s) => el("option", {value: s, text: s})));
      this.seed = el("select", {"aria-label": "seed", class: "xp-seed"},
        ...seeds.map((s) => el("option", {value: String(s), text: String(s)})));
      const change = () => this.choose(this.choices.find(
        (c) => c.sequence === this.sequence.value && String(c.seed) === this.seed.value).key);
      this.sequence.addEventListener("change", change);
      this.seed.addEventListener("change", change);
      this.prev = el("button", {type: "button", class: "xp-button xp-prev", text: "◀ previous step"});
      this.next = el("button", {type: "button", class: "xp-button xp-next", text: "next step ▶"});
      this.slider = el("input", {type: "range", min: "0", value: "0", class: "xp-slider", "aria-label": "step"});
      this.prev.addEventListener("click", () => this.go(this.position - 1));
      this.next.addEventListener("click", () => this.go(this.position + 1));
      this.slider.addEventListener("input", () => this.go(Number(this.slider.value)));
      this.title = el("p", {class: "xp-title", "aria-live": "polite"});
      this.grids = el("div", {class: "xp-grids"});
      // What the pointer or the focus is on (not announced: it changes at every move), then what a choice shows.
      this.readout = el("p", {class: "xp-readout", text: "Point at an entry, or move to it with Tab."});
      this.summary = el("p", {class: "xp-summary", "aria-live": "polite"});
      this.flows = el("ul", {class: "xp-flows"});
      this.equation = el("div", {class: "xp-equation"});
      this.root.replaceChildren(
        el("div", {class: "xp-controls"}, el("label", {}, "tokens ", this.sequence), el("label", {}, " seed ", this.seed),
          this.prev, this.slider, this.next),
        this.title, this.grids, this.readout, this.summary, this.flows, this.equation);
      this.enable(false);
    }

    enable(on) {  // the controls work once a choice's data is there
      for (const control of [this.prev, this.next, this.slider]) control.disabled = !on;
    }

    choose(key) {
      const choice = this.choices.find((c) => c.key === key);
      this.sequence.value = choice.sequence;
      this.seed.value = String(choice.seed);
      const ticket = (this.ticket = (this.ticket || 0) + 1);  // only the latest choice is drawn
      return load(this.base, key).then((d) => {
        if (ticket !== this.ticket) return;
        this.data = d;
        this.slider.max = String(2 * d.steps.length - 1);
        this.enable(true);
        this.go(this.position);
        this.root.dataset.shown = key;
      }, (error) => {
        if (ticket === this.ticket) this.summary.textContent = `The numbers of this choice did not load: ${error.message}`;
      });
    }

    go(position) {
      const n = this.data.steps.length;
      this.position = Math.max(0, Math.min(2 * n - 1, position));
      this.backward = this.position >= n;
      this.step = this.data.steps[this.backward ? 2 * n - 1 - this.position : this.position];
      this.slider.value = String(this.position);
      this.prev.disabled = this.position === 0;
      this.next.disabled = this.position === 2 * n - 1;
      this.selected = null;
      this.draw();
    }

    draw() {
      const s = this.step, t = this.data.tensors;
      const k = this.data.steps.indexOf(s) + 1;
      this.title.textContent = `${this.backward ? "Backward" : "Forward"}, step ${k} of ${this.data.steps.length}: ` +
        `${s.title} (ids ${this.data.ids.join(" ")}, targets ${this.data.targets.join(" ")})`;
      const inputs = s.inputs.map((name, i) => this.grid(name, "input", i));
      const output = this.grid(s.output, "output", 0);
      this.grids.replaceChildren(...(this.backward ? [output, ...inputs] : [...inputs, output]));
      this.flows.replaceChildren();
      this.summary.textContent = this.backward
        ? `The gradient ${grad(t[s.output].symbol)} goes back through ${s.title}. Choose an entry of it.`
        : `Choose an entry of ${t[s.output].symbol} to see what it depends on.`;
      this.showEquation();
    }

    showEquation() {
      for (const block of document.querySelectorAll(".xp-step.xp-current")) block.classList.remove("xp-current");
      const block = document.getElementById(`xp-step-${this.step.id.replace(/\./g, "-")}`);
      if (!block) return this.equation.replaceChildren();
      block.classList.add("xp-current");
      const copy = block.cloneNode(true);
      copy.removeAttribute("id");
      copy.classList.remove("xp-current");
      this.equation.replaceChildren(copy);
    }

    grid(name, role, index) {
      const tensor = this.data.tensors[name];
      // In the backward an input shows what this step sends it: all of its gradient unless another step reads it.
      const own = this.backward && role === "input";
      const values = own ? this.step.dx[index] : this.backward ? tensor.grad : tensor.value;
      const label = this.backward ? grad(tensor.symbol) : tensor.symbol;
      const note = own && this.step.shared[index] ? ", this step's share" : "";
      const [rows, cols] = tensor.shape;
      const limit = Math.max(...values.map(Math.abs)) || 1;
      const cells = el("div", {class: "xp-cells", role: "group", "aria-label": `${label}, ${rows} by ${cols}`,
        style: `grid-template-columns: repeat(${cols}, minmax(2.6rem, 1fr))`});
      values.forEach((v, flat) => {
        const [r, c] = [Math.floor(flat / cols), flat % cols];
        const cell = el("button", {type: "button", class: "xp-cell", "data-tensor": name, "data-role": role,
          "data-input": String(index), "data-index": String(flat), "aria-label": `${label}[${r}, ${c}] = ${v}`,
          tabindex: flat === 0 ? "0" : "-1",  // one stop per grid: the arrows move within it
          style: `--xp-weight: ${(Math.abs(v) / limit).toFixed(3)}`, text: v.toFixed(2)});
        if (role === "output") cell.setAttribute("aria-pressed", "false");
        cell.classList.add(v < 0 ? "xp-negative" : "xp-positive");
        const show = () => { this.readout.textContent = `${label}[${r}, ${c}] = ${v}`; };
        cell.addEventListener("focus", () => {
          for (const other of cells.children) other.tabIndex = other === cell ? 0 : -1;
        });
        cell.addEventListener("mouseenter", show);
        cell.addEventListener("focus", show);
        cell.addEventListener("keydown", (event) => this.arrow(event, cells, flat, rows, cols));
        if (role === "output") cell.addEventListener("click", () => this.select(flat));
        cells.append(cell);
      });
      return el("figure", {class: `xp-grid xp-${role}`},
        el("figcaption", {text: `${label} (${name}, ${rows} × ${cols}${note})${role === "output" ? ": choose an entry" : ""}`}),
        cells);
    }

    arrow(event, cells, flat, rows, cols) {
      const moves = {ArrowLeft: -1, ArrowRight: 1, ArrowUp: -cols, ArrowDown: cols};
      if (!(event.key in moves)) return;
      event.preventDefault();  // at the grid's edge too: the arrows move within the grid, never the page
      const to = flat + moves[event.key];
      const sameRow = Math.abs(moves[event.key]) !== 1 || Math.floor(to / cols) === Math.floor(flat / cols);
      if (to >= 0 && to < rows * cols && sameRow) cells.children[to].focus();
    }

    select(o) {
      const s = this.step, t = this.data.tensors;
      this.selected = o;
      for (const cell of this.grids.querySelectorAll(".xp-cell")) {
        const chosen = cell.dataset.role === "output" && Number(cell.dataset.index) === o;
        cell.classList.toggle("xp-chosen", chosen);
        if (cell.dataset.role === "output") cell.setAttribute("aria-pressed", String(chosen));
        cell.classList.remove("xp-dep");
      }
      const out = t[s.output], cols = out.shape[1];
      const dy = out.grad[o];
      const name = `${out.symbol}[${Math.floor(o / cols)}, ${o % cols}]`;
      const items = [];
      s.jacobians.forEach((rows, k) => {
        const input = t[s.inputs[k]], icols = input.shape[1];
        for (const [i, j] of rows[o]) {
          const cell = this.grids.querySelector(`.xp-cell[data-role="input"][data-input="${k}"][data-index="${i}"]`);
          cell.classList.add("xp-dep");
          const at = `${input.symbol}[${Math.floor(i / icols)}, ${i % icols}]`;
          items.push(el("li", {class: "xp-flow", "data-input": String(k), "data-index": String(i),
            text: this.backward
              ? `${grad(at)} gets ${short(dy)} × ${short(j)} = ${short(dy * j)}`
              : `∂${name}/∂${at} = ${short(j)}`}));
        }
      });
      const count = items.length;
      this.summary.textContent = this.backward
        ? `${grad(name)} = ${dy} flows back to the ${count} input entries its Jacobian row reaches, to each ` +
          `times ∂${name}/∂(that entry):`
        : `${name} depends on ${count} input entries (the non-zero entries of its Jacobian row):`;
      this.flows.replaceChildren(...items);
    }
  }

  function start() {
    for (const root of document.querySelectorAll(".explorer[data-choices]")) {
      // The print edition gathers every page into one (site_scripts/print_gather.py) and prints the still
      // picture instead: its data files are not beside that page.
      if (!root.explorer && !root.closest(".print-page")) root.explorer = new Explorer(root);
    }
  }
  // Material announces each page it draws on document$, but not on a page opened from disk (file://), where its
  // instant loading cannot fetch pages: there the page is drawn once, now or when the document is read.
  if (window.document$ && location.protocol !== "file:") window.document$.subscribe(start);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
