"""The chapters' quizzes (site_scripts/pages/_quiz.py and the four quiz generators), read from the markup the pages
include: every question has one right choice and an explanation for each choice, links to a place its answer is
explained, and the right answers recomputed here from the configs, independently of the generators, are the
choices the markup marks right. A renderer that marked another choice would be caught (the negative control)."""

import html as html_lib
import math
import re
from dataclasses import replace
from html.parser import HTMLParser

import markdown
import pytest
from markdown.extensions.toc import slugify

from site_scripts import prose, registry
from site_scripts.common import ROOT
from site_scripts.pages import _quiz, quiz_finetuning, quiz_generation, quiz_model, quiz_training
from transformer.config import PRESETS
from transformer.lora import LoRAConfig, TARGETS
from transformer.train_config import TrainConfig

GENERATORS = {"quiz_model": quiz_model, "quiz_training": quiz_training, "quiz_finetuning": quiz_finetuning,
              "quiz_generation": quiz_generation}


class Quiz(HTMLParser):
    """The questions of a quiz's HTML: for each, its id, its link, and its choices as (right, button text,
    explanation text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.questions, self.open = [], []  # open: the class of each element not yet closed
        self.text = None  # the (choice, "text" or "why") being read

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        self.open.append(classes)
        if "quiz-question" in classes:
            self.questions.append({"id": attrs.get("id"), "choices": [], "links": []})
        elif "quiz-choice" in classes:
            self.questions[-1]["choices"].append({"right": attrs.get("data-right"), "text": "", "why": ""})
        elif "quiz-pick" in classes:
            self.text = "text"
        elif "quiz-why" in classes:
            self.text = "why"
        elif tag == "a" and any("quiz-where" in c for c in self.open):
            self.questions[-1]["links"].append(attrs["href"])

    def handle_endtag(self, tag):
        classes = self.open.pop()
        if "quiz-pick" in classes or "quiz-why" in classes:
            self.text = None

    def handle_data(self, data):
        if self.text:
            self.questions[-1]["choices"][-1][self.text] += data


def html(fragment):
    """The fragment as mkdocs renders it (the extensions the quiz markup relies on, as mkdocs.yml sets them)."""
    return markdown.markdown(fragment, extensions=["attr_list", "md_in_html", "pymdownx.arithmatex"],
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})


def read(fragment):
    parser = Quiz()
    parser.feed(html(fragment))
    return parser.questions


def right_texts(fragment):
    """The button text of every choice the markup marks right, question by question."""
    return [[c["text"].strip() for c in q["choices"] if c["right"] == "true"] for q in read(fragment)]


@pytest.fixture(scope="module")
def made():
    return {page: module.generate({}) for page, module in GENERATORS.items()}


@pytest.mark.parametrize("page", GENERATORS)
def test_every_question_has_one_right_choice_and_an_explanation_for_each(made, page):
    questions = read(made[page]["quiz"])
    assert 3 <= len(questions) <= 5 and made[page]["values"] == {"questions": len(questions)}
    for q in questions:
        rights = [c["right"] for c in q["choices"]]
        assert rights.count("true") == 1 and rights.count("false") == len(rights) - 1 >= 2, q["id"]
        for c in q["choices"]:
            assert c["text"].strip() and c["why"].strip(), (q["id"], c)
            assert c["why"].strip().startswith(_quiz.VERDICT[c["right"] == "true"]), (q["id"], c)
        assert len({c["text"] for c in q["choices"]}) == len(q["choices"]), q["id"]


def anchors(path):
    """The anchors of a docs page: explicit ones ({#id}) and those of its headings without one."""
    text = path.read_text()
    found = set(re.findall(r"\{#([\w-]+)\}", text))
    for heading in re.findall(r"(?m)^#{2,6} (.+?)\s*$", text):
        if "{#" not in heading:
            found.add(slugify(heading, "-"))
    return found


@pytest.mark.parametrize("page", GENERATORS)
def test_every_question_links_to_an_anchor_of_another_page_in_the_docs(made, page):
    here = (ROOT / "docs" / registry.BY_ID[page].path).parent
    for q in read(made[page]["quiz"]):
        (link,) = q["links"]
        target, _, anchor = link.partition("#")
        path = (here / target).resolve()
        assert path.is_file() and anchor in anchors(path), (q["id"], link)


@pytest.mark.parametrize("page", GENERATORS)
def test_the_quiz_page_binds_its_values_and_includes_its_quiz(made, page):
    entry = registry.BY_ID[page]
    text = (ROOT / "docs" / entry.path).read_text()
    assert f'--8<-- "{page}/quiz.md"' in text and not prose.typed_numbers(text)
    assert "{{" not in prose.bind(text, made[page]["values"], entry.path)


# ---------------------------------------------------------------- right answers, recomputed from the configs

def right_of(made, page, question_id):
    (question,) = [q for q in read(made[page]["quiz"]) if q["id"] == question_id]
    (text,) = [c["text"].strip() for c in question["choices"] if c["right"] == "true"]
    return text


def test_the_attention_weights_shape_is_batch_heads_and_positions_twice(made):
    cfg = PRESETS["tiny"]
    batch, positions = quiz_model.IDS.shape
    assert right_of(made, "quiz_model", "quiz-attention-weights") == str((batch, cfg.num_heads, positions, positions))


def test_the_lora_count_is_the_rank_times_in_plus_out_for_each_adapted_matrix(made):
    cfg, lora = PRESETS["default"], LoRAConfig()
    d = cfg.emb_dim
    assert {TARGETS[t] for t in lora.targets} == {"wq", "wv"}  # both d × d
    per_matrix = lora.rank * (d + d)
    assert right_of(made, "quiz_finetuning", "quiz-lora-count") == str(cfg.num_layers * len(lora.targets) * per_matrix)


def test_the_warmup_starts_at_the_peak_over_the_warmup_steps(made):
    tc = TrainConfig()
    assert right_of(made, "quiz_training", "quiz-warmup") == f"{tc.lr / tc.warmup:g}"


def test_the_nf4_bytes_are_half_a_byte_a_weight_plus_a_byte_a_block_and_the_second_level(made):
    cfg = PRESETS["default"]
    n = cfg.emb_dim * cfg.ff_dim
    blocks = math.ceil(n / 64)
    stored = n / 2 + blocks + 4 * math.ceil(blocks / 256) + 4  # codes, 8-bit scales, float32 scales, offset
    assert right_of(made, "quiz_finetuning", "quiz-nf4-bytes") == f"{stored / n:.4f}"


def test_a_paged_prompt_leases_its_length_over_the_page_size_rounded_up(made):
    pages = math.ceil(len(quiz_generation.PAGED_PROMPT) / quiz_generation.PAGE_SIZE)
    assert right_of(made, "quiz_generation", "quiz-pages") == str(pages)


# ---------------------------------------------------------------- the renderer, and its negative control

QUESTION = _quiz.Question(
    "quiz-test", "Which?", (_quiz.Choice("`a`", "because a", right=True), _quiz.Choice("b", "not b"),
                            _quiz.Choice("\\(c\\)", "not c")), "page.md#there", "there")


def plain(text):
    """Inline markdown as the reader sees its text (`a`, `b` -> a, b)."""
    return html_lib.unescape(re.sub(r"<[^>]+>", "", html(text))).strip()


def marks_flagged(markup, questions):
    """Whether the markup marks right, in each question, exactly the choice the question flags right."""
    return right_texts(markup) == [[plain(q.right.text)] for q in questions]


def test_the_markup_marks_right_exactly_the_choice_flagged_right(made):
    assert marks_flagged(_quiz.quiz_md([QUESTION]), [QUESTION])
    for page, module in GENERATORS.items():
        assert marks_flagged(made[page]["quiz"], module.questions()), page


def test_a_flipped_flag_moves_the_mark_and_the_check_sees_it():
    """Negative control: the same question with another choice flagged right is marked otherwise, and the check
    above, run against the first question's flag, fails on it."""
    choices = tuple(replace(c, right=c.text == "b") for c in QUESTION.choices)
    flipped = replace(QUESTION, choices=choices)
    assert marks_flagged(_quiz.quiz_md([flipped]), [flipped])
    assert not marks_flagged(_quiz.quiz_md([flipped]), [QUESTION])


@pytest.mark.parametrize("rights", [0, 2])
def test_a_question_without_exactly_one_right_choice_is_refused(rights):
    choices = tuple(replace(c, right=i < rights) for i, c in enumerate(QUESTION.choices))
    with pytest.raises(ValueError, match=f"has {rights} right choices"):
        replace(QUESTION, choices=choices)


def test_without_the_script_the_markup_shows_every_explanation_and_the_style_marks_the_right_choice():
    """What the page relies on when no script runs and in print: the explanations are in the markup (quiz.js only
    hides them), and quiz.css marks the right choice by its data-right attribute there."""
    assert all(c["why"] for q in read(_quiz.quiz_md([QUESTION])) for c in q["choices"])
    css = (ROOT / "docs/assets/quiz.css").read_text()
    assert '.quiz:not(.quiz-live) .quiz-choice[data-right="true"] .quiz-pick::before' in css
    print_rules = css[css.index("@media print"):]
    assert '.quiz-live .quiz-choice:not(.quiz-chosen) .quiz-why' in print_rules
    assert '.quiz .quiz-choice[data-right="true"] .quiz-pick::before' in print_rules
