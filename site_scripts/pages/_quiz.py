"""The quiz at the end of each chapter: a question, its choices, and the markup the site shows them in.

Every choice carries its own explanation, written for the reader who picked it: why it is right, or which
mistake leads to it and why it is wrong. The quiz pages' generators (quiz_model.py, quiz_training.py,
quiz_finetuning.py, quiz_generation.py) compute each choice and each number of an explanation from the code of
transformer/; this module checks that a question is well formed and writes it as HTML inside markdown
(md_in_html), which docs/assets/quiz.js makes answerable and docs/assets/quiz.css styles. Without the script,
and in print, every explanation shows and the right choice is marked: the quiz reads as questions with their
answers."""

import hashlib
from dataclasses import dataclass

VERDICT = {True: "Right.", False: "Not this one."}


@dataclass(frozen=True)
class Choice:
    """An answer a reader may choose. `text` and `why` are inline markdown (math as \\( \\), code in backticks);
    `why` says why the choice is right, or which mistake leads to it and why that is wrong."""
    text: str
    why: str
    right: bool = False


@dataclass(frozen=True)
class Question:
    """A question, its choices (exactly one right), and where its answer is explained: `link` is relative to the
    quiz's page (`attention.md#eq-attn-scores`), `where` the link's text. `id` is the question's anchor on its
    page; it also fixes the order its choices are shown in (`shown_order`)."""
    id: str
    text: str
    choices: tuple
    link: str
    where: str

    def __post_init__(self):
        rights = sum(c.right for c in self.choices)
        if rights != 1:
            raise ValueError(f"question {self.id!r} has {rights} right choices; it needs exactly one")
        texts = [c.text for c in self.choices]
        if len(set(texts)) != len(texts):
            raise ValueError(f"question {self.id!r} offers one choice twice: {texts}")
        if len(texts) < 3 or not all(c.why.strip() for c in self.choices):
            raise ValueError(f"question {self.id!r} needs three choices or more, each with its explanation")
        if "#" not in self.link:
            raise ValueError(f"question {self.id!r} links to a page, not to the place its answer is explained")

    @property
    def right(self):
        return next(c for c in self.choices if c.right)


def shown_order(question):
    """The choices in the order the page shows them, sorted by a hash of the question's id and each choice's
    text: the right one does not always stand first, and every build shows the same order."""
    return sorted(question.choices,
                  key=lambda c: hashlib.sha256(f"{question.id}\n{c.text}".encode()).hexdigest())


def choice_md(choice):
    """One choice: a button (quiz.js marks it right or wrong when chosen) and its explanation, which opens with
    its verdict. `data-right` tells the script, and the style sheet where no script runs, which one is right."""
    return (f'<div class="quiz-choice" data-right="{str(choice.right).lower()}" markdown>\n'
            f'<button type="button" class="quiz-pick">{choice.text}</button>\n'
            f'<div class="quiz-why" markdown>\n\n'
            f'<strong class="quiz-verdict">{VERDICT[choice.right]}</strong> {choice.why}\n\n'
            f'</div>\n</div>')


def question_md(number, question):
    """One question: its text, its choices, and the link to where its answer is explained."""
    choices = "\n".join(choice_md(c) for c in shown_order(question))
    return (f'<div class="quiz-question" id="{question.id}" markdown>\n'
            f'<p class="quiz-ask" markdown="span"><strong>{number}.</strong> {question.text}</p>\n'
            f'{choices}\n'
            f'<p class="quiz-where" markdown="span">Explained in [{question.where}]({question.link}).</p>\n'
            f'</div>')


def quiz_md(questions):
    """A whole quiz, the questions numbered from 1, as the markdown fragment a quiz page includes."""
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two questions share an id: {ids}")
    body = "\n\n".join(question_md(n, q) for n, q in enumerate(questions, 1))
    return f'<div class="quiz" markdown>\n\n{body}\n\n</div>\n'


def page(questions):
    """A quiz page's fragments: its quiz, and the number of questions its prose shows."""
    return {"values": {"questions": len(questions)}, "quiz": quiz_md(questions)}
