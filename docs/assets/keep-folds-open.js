// A folded block the reader opened stays open when Material's instant navigation draws the page again, as it
// does on following a link within the page (a code annotation's link to its equation): a page drawn again has
// its evidence folded, and the browser's Back button would then return to a scroll position that no longer
// shows the listing the reader left. Which blocks are open is kept per page, for the browser tab.
(() => {
  const key = () => `open-folds:${location.pathname}`;
  const blocks = () => [...document.querySelectorAll("article details")];
  function remember() {
    const open = blocks().flatMap((block, i) => (block.open ? [i] : []));
    try { sessionStorage.setItem(key(), JSON.stringify(open)); } catch (error) { /* storage refused: forget */ }
  }
  function restore() {
    let open = [];
    try { open = JSON.parse(sessionStorage.getItem(key()) || "[]"); } catch (error) { /* nothing kept */ }
    const all = blocks();
    for (const i of open) if (all[i]) all[i].open = true;
    for (const block of all) block.addEventListener("toggle", remember);
  }
  if (window.document$) window.document$.subscribe(restore);  // every page Material draws, the first included
  else document.addEventListener("DOMContentLoaded", restore);
})();
