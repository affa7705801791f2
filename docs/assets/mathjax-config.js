// MathJax 3, served locally. Typeset only the arithmatex spans, and again
// after each of Material's instant page changes.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"},
  startup: {
    typeset: false,
    ready: () => {
      MathJax.startup.defaultReady();
      document$.subscribe(() => {
        MathJax.startup.promise = MathJax.startup.promise
          .then(() => { MathJax.typesetClear(); MathJax.texReset(); return MathJax.typesetPromise(); });
      });
    },
  },
};
