// The quiz at the end of each chapter (site_scripts/pages/_quiz.py writes its markup). The page holds every
// explanation and marks the right choice, so that without this script, and in print, it reads as questions with
// their answers. This script makes it a quiz: it hides the explanations (quiz.css, under .quiz-live), and
// choosing a choice's button (a click, or Enter or Space on it) marks the choice right or wrong and shows that
// choice's explanation alone. Other choices stay as they are until chosen in turn.
(() => {
  function choose(button) {
    const choice = button.closest(".quiz-choice");
    const right = choice.dataset.right === "true";
    choice.classList.add("quiz-chosen", right ? "quiz-right" : "quiz-wrong");
    button.setAttribute("aria-expanded", "true");  // its explanation, just after it, now shows
  }

  function start() {
    for (const quiz of document.querySelectorAll(".quiz")) {
      // Once per quiz; the print edition gathers every page into one (site_scripts/print_gather.py) and keeps the
      // answers shown there.
      if (quiz.classList.contains("quiz-live") || quiz.closest(".print-page")) continue;
      for (const button of quiz.querySelectorAll(".quiz-pick")) {
        button.setAttribute("aria-expanded", "false");
        button.addEventListener("click", () => choose(button));
      }
      quiz.classList.add("quiz-live");
    }
  }
  // Material announces each page it draws on document$, but not on a page opened from disk (file://), where its
  // instant loading cannot fetch pages: there the page is drawn once, now or when the document is read.
  if (window.document$ && location.protocol !== "file:") window.document$.subscribe(start);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
