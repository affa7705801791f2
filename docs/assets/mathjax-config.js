// MathJax 3, served locally. Typeset only the arithmatex spans, and again after each of Material's instant
// page changes. A page opened from disk (file://) gets no such event, since instant loading fetches pages and a
// browser refuses that there: it is typeset once, as soon as MathJax is ready.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"},
  startup: {
    typeset: false,
    ready: () => {
      MathJax.startup.defaultReady();
      const typeset = () => {
        MathJax.startup.promise = MathJax.startup.promise
          .then(() => { MathJax.typesetClear(); MathJax.texReset(); return MathJax.typesetPromise(); });
      };
      if (location.protocol === "file:") typeset();
      document$.subscribe(typeset);
    },
  },
};
