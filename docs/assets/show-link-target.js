// A link to a code line in a page's folded evidence: Material opens the folded block that holds the line and
// then scrolls to the top of the block (details.scrollIntoView), which leaves the line itself a screen or more
// below when that scroll comes last. A block that holds the page's target shows the target instead, in the
// middle of the window, clear of the header.
function linkTarget() {
  try {
    const id = decodeURIComponent(location.hash.slice(1));
    return id ? document.getElementById(id) : null;
  } catch (error) {  // a hash that is not valid percent-encoding names no element
    return null;
  }
}
HTMLDetailsElement.prototype.scrollIntoView = function (...options) {
  const target = linkTarget();
  if (target && this.contains(target)) Element.prototype.scrollIntoView.call(target, {block: "center"});
  else Element.prototype.scrollIntoView.apply(this, options);
};
