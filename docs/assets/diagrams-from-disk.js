// Material draws the mermaid diagrams when it shows a page; a page opened from disk (file://) never gets that
// event (see mathjax-config.js), and mermaid's own start-up would read the diagram with its HTML around it.
// So mermaid never starts by itself, and from disk this draws the diagrams once the page has loaded.
mermaid.initialize({startOnLoad: false});
if (location.protocol === "file:") {
  window.addEventListener("load", () => {
    for (const pre of document.querySelectorAll("pre.mermaid")) {
      const diagram = document.createElement("div");
      diagram.className = "mermaid";
      diagram.textContent = pre.textContent;
      pre.replaceWith(diagram);
    }
    mermaid.run();
  });
}
