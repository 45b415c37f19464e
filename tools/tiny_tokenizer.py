"""Offline, deterministic byte-level BPE tokenizers for the tiny checkpoints.

The training text is generated here from fixed word lists (markdown tables of people, questions
about them, short sentences), so no download is needed and typical demo prompts (long tables and
"what is the age of X?") tokenize into a sensible number of tokens rather than one per byte.
Special tokens are appended after the trained vocabulary so that ``len(tokenizer)`` equals the
requested size exactly; the model's ``vocab_size`` is set to that number.
"""

from __future__ import annotations

import json
import pathlib
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# Same split regex as Qwen2's tokenizer, so that our vocab/merges rebuild identically inside
# transformers' Qwen2Tokenizer (which re-creates the pre-tokenizer from code, not from the file).
_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _w(text: str) -> list[str]:
    return text.split()


_FIRST = _w(
    "John Jane Alice Bob Carol Dave Emma Frank Grace Henry Irene Jack Karen Leo Mia Noah Olivia "
    "Peter Quinn Rachel Steve Tina Umar Victor Wendy Xavier Yara Zack Amy Ben Chloe Daniel Eva "
    "Felix Hana Ivan Julia Kevin Laura Marco Nina Oscar Paula Ravi Sara Tom Uma Vera Will Zoe"
)
_LAST = _w(
    "Doe Smith Johnson Brown White Green Black Blue Yellow Violet Orange Indigo Red Gray Silver "
    "Gold Stone River Hill Wood Field Lake Moore Clark Lewis Walker Young King Wright Scott"
)
_JOBS = _w(
    "Engineer Doctor Teacher Artist Scientist Lawyer Musician Chef Nurse Pilot Writer Farmer "
    "Designer Manager Student Baker Driver Dentist Architect Editor"
)
_PLACES = [
    ("USA", "Springfield"), ("USA", "New York"), ("USA", "Boston"), ("USA", "Seattle"),
    ("Canada", "Toronto"), ("Canada", "Vancouver"), ("Canada", "Ottawa"), ("UK", "London"),
    ("UK", "Manchester"), ("UK", "Leeds"), ("Australia", "Sydney"), ("Australia", "Perth"),
    ("New Zealand", "Wellington"), ("New Zealand", "Auckland"), ("Ireland", "Dublin"),
    ("Ireland", "Cork"), ("France", "Paris"), ("Germany", "Berlin"), ("Japan", "Tokyo"),
    ("Brazil", "Rio"),
]  # fmt: skip
_STREETS = _w("Elm Oak Pine Maple Birch Cedar Ash Spruce Fir Willow Poplar Main")
_SENTENCES = [
    "You are a helpful assistant that reads tables in markdown format.",
    "Here is a table as follows.",
    "A gentle breeze stirred the leaves as children laughed in the distance.",
    "The quick brown fox jumps over the lazy dog.",
    "Please answer the question in one short sentence.",
    "The answer is given in the table above.",
    "Describe the image and the sound in a few words.",
    "Prefix caching reuses the key and value blocks of a shared prompt.",
    "Once upon a time there was a small model that could only say a few words.",
]
# Common English words for filler sentences: enough distinct words that BPE can learn ~2k merges.
_WORDS = _w(
    "the of and to in is was that for on are with as his they be at one have this from or had "
    "by hot word but what some we can out other were all there when up use your how said an each "
    "she which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find any new work part take get "
    "place made live where after back little only round man year came show every good me give "
    "our under name very through just form sentence great think say help low line differ turn "
    "cause much mean before move right boy old too same tell does set three want air well also "
    "play small end put home read hand port large spell add even land here must big high such "
    "follow act why ask men change went light kind off need house picture try us again animal "
    "point mother world near build self earth father head stand own page should country found "
    "answer school grow study still learn plant cover food sun four between state keep eye never "
    "last let thought city tree cross farm hard start might story saw far sea draw left late run "
    "while press close night real life few north open seem together next white children begin "
    "got walk example ease paper group always music those both mark often letter until mile "
    "river car feet care second book carry took science eat room friend began idea fish "
    "mountain stop once base hear horse cut sure watch color face wood main enough plain girl "
    "usual young ready above ever red list though feel talk bird soon body dog family direct "
    "pose leave song measure door product black short numeral class wind question happen "
    "complete ship area half rock order fire south problem piece told knew pass since top whole "
    "king space heard best hour better during hundred five remember step early hold west ground "
    "interest reach fast verb sing listen six table travel less morning ten simple several vowel "
    "toward war lay against pattern slow center love person money serve appear road map rain "
    "rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark "
    "machine note wait plan figure star box noun field rest correct able pound done beauty drive "
    "stood contain front teach week final gave green quick develop ocean warm free minute "
    "strong special mind behind clear tail produce fact street inch multiply nothing course "
    "stay wheel full force blue object decide surface deep moon island foot system busy test "
    "record boat common gold possible plane stead dry wonder laugh thousand ago ran check game "
    "shape equate miss brought heat snow tire bring yes distant fill east paint language among"
)
_SYLLABLES = _w("ka ri to ne sa mo lu vi da pe zo ha ki ra mi no be tu sho gan lin mar el an")
_QUESTIONS = [
    "What is the age of {name}?",
    "Where does {name} live?",
    "What is the occupation of {name}?",
    "What is the email address of {name}?",
    "Which country is {name} from?",
    "Who is older, {name} or {other}?",
]


def corpus(num_rows: int = 2000, seed: int = 1234) -> list[str]:
    """Deterministic English-ish training text: tables, questions, answers and sentences."""
    rng = random.Random(seed)  # fixed: the tokenizer must not depend on the weight seed
    lines = list(_SENTENCES)
    lines.append("| ID | Name | Age | Occupation | Country | Email | Phone Number | Address |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i in range(1, num_rows + 1):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        country, city = rng.choice(_PLACES)
        age = rng.randint(18, 80)
        name = f"{first} {last}"
        email = f"{first.lower()}.{last[0].lower()}@example.com"
        phone = f"555-{rng.randint(0, 9999):04d}"
        street = f"{rng.randint(100, 999)} {rng.choice(_STREETS)} St, {city}"
        cells = [str(i), name, str(age), rng.choice(_JOBS), country, email, phone, street]
        if i % 2:
            # Column-aligned tables (padding spaces, long dash rules) as LLM-written markdown has.
            widths = [rng.randint(len(c), len(c) + 8) for c in cells]
            cells = [c.ljust(w) for c, w in zip(cells, widths, strict=True)]
            if i % 10 == 1:
                lines.append("| " + " | ".join("-" * w for w in widths) + " |")
        lines.append("| " + " | ".join(cells) + " |")
        q = rng.choice(_QUESTIONS).format(name=name, other=f"{rng.choice(_FIRST)} Doe")
        lines.append(f"Question: {q}\nAnswer: {name} is {age} years old and lives in {city}.")
        if i % 7 == 0:
            lines.append(rng.choice(_SENTENCES))
        # Filler prose, plus made-up names from syllables so rarer pairs keep BPE merging.
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
        made_up = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        lines.append(" ".join(words).capitalize() + f" near {made_up.capitalize()}.")
    return lines


def train_bpe(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE on ``corpus()`` and return (vocab, merges) without specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # All 256 byte symbols so any text (also Chinese) encodes without unknowns.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def _with_specials(
    vocab_size: int, specials: list[str]
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab, merges = train_bpe(vocab_size - len(specials))
    if len(vocab) != vocab_size - len(specials):
        raise RuntimeError(f"BPE trained {len(vocab)} tokens, wanted {vocab_size - len(specials)}")
    for name in specials:
        vocab[name] = len(vocab)
    return vocab, merges


def save_qwen2_tokenizer(out_dir: pathlib.Path, vocab_size: int, specials: list[str], **kwargs):
    """Qwen2-style tokenizer (no BOS, EOS ``<|endoftext|>``); ``specials[0]`` must be EOS."""
    from transformers import Qwen2Tokenizer

    vocab, merges = _with_specials(vocab_size, specials)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        eos_token=specials[0],
        pad_token=specials[0],
        unk_token=None,
        additional_special_tokens=specials[1:],
        **kwargs,
    )
    tok.model_max_length = 32768
    tok.save_pretrained(str(out_dir))
    return tok


def save_llama_tokenizer(out_dir: pathlib.Path, vocab_size: int):
    """Llama-3-style byte-level tokenizer that prepends ``<|begin_of_text|>`` like the real one."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    vocab, merges = _with_specials(vocab_size, [bos, eos])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos
    )
    fast.model_max_length = 32768
    fast.save_pretrained(str(out_dir))
    return fast
