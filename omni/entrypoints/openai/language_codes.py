"""check_language: the ISO-639-1 codes the transcription endpoints and the realtime session's
input transcription take (a 400 naming the field otherwise); language_name: a code as
verbose_json names its language (English names in lower case, as OpenAI's Whisper answers)."""

from __future__ import annotations

import re

from omni.entrypoints.openai.errors import bad_request

_LANGUAGE = re.compile(r"[a-z]{2}")


def check_language(language: str | None, param: str) -> None:
    """A 400 naming `param` unless `language` is None or an ISO-639-1 code."""
    if language is not None and not _LANGUAGE.fullmatch(language):
        raise bad_request(f"{param}: an ISO-639-1 code (e.g. 'en'), got {language!r}", param)


# ISO-639-1 code -> English name, lower case: the languages Whisper transcribes
NAMES = dict(
    item.split(":")
    for item in (
        "af:afrikaans am:amharic ar:arabic as:assamese az:azerbaijani ba:bashkir be:belarusian "
        "bg:bulgarian bn:bengali bo:tibetan br:breton bs:bosnian ca:catalan cs:czech cy:welsh "
        "da:danish de:german el:greek en:english es:spanish et:estonian eu:basque fa:persian "
        "fi:finnish fo:faroese fr:french gl:galician gu:gujarati ha:hausa he:hebrew hi:hindi "
        "hr:croatian ht:haitian_creole hu:hungarian hy:armenian id:indonesian is:icelandic "
        "it:italian ja:japanese jv:javanese ka:georgian kk:kazakh km:khmer kn:kannada ko:korean "
        "la:latin lb:luxembourgish ln:lingala lo:lao lt:lithuanian lv:latvian mg:malagasy "
        "mi:maori mk:macedonian ml:malayalam mn:mongolian mr:marathi ms:malay mt:maltese "
        "my:myanmar ne:nepali nl:dutch nn:nynorsk no:norwegian oc:occitan pa:punjabi pl:polish "
        "ps:pashto pt:portuguese ro:romanian ru:russian sa:sanskrit sd:sindhi si:sinhala "
        "sk:slovak sl:slovenian sn:shona so:somali sq:albanian sr:serbian su:sundanese "
        "sv:swedish sw:swahili ta:tamil te:telugu tg:tajik th:thai tk:turkmen tl:tagalog "
        "tr:turkish tt:tatar uk:ukrainian ur:urdu uz:uzbek vi:vietnamese yi:yiddish yo:yoruba "
        "zh:chinese"
    ).split()
)


def language_name(code: str) -> str:
    """`code`'s language by name (a code without a name here is kept as it is)."""
    return NAMES.get(code, code).replace("_", " ")
