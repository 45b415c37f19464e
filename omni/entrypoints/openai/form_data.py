"""Form bodies, as the audio endpoints take them: multipart/form-data (RFC 7578; each part's field
name, file name and bytes), or URL-encoded fields (no files). Written on the standard library (its
header parser reads each part's headers), so the server needs no multipart package; every
malformed body is a 400."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesHeaderParser

from omni.entrypoints.openai.errors import bad_request


@dataclass(frozen=True)
class FormPart:
    name: str
    data: bytes
    filename: str | None  # set for a file field

    def text(self) -> str:
        """A plain field's value (a 400 naming the field unless it is UTF-8)."""
        try:
            return self.data.decode()
        except UnicodeDecodeError:
            raise bad_request(f"{self.name}: not UTF-8 text", self.name) from None


def parse_form(body: bytes, content_type: str | None) -> dict[str, list[FormPart]]:
    """Field name -> its parts, in order (a field may repeat, e.g. `include[]`)."""
    header = Message()
    header["content-type"] = content_type or ""
    if header.get_content_type() == "application/x-www-form-urlencoded":
        fields: dict[str, list[FormPart]] = {}
        # latin-1 maps bytes to characters one to one: the values' bytes come back as sent.
        pairs = urllib.parse.parse_qsl(body.decode("latin-1"), True, encoding="latin-1")
        for key, value in pairs:
            name = key.encode("latin-1").decode(errors="replace")
            fields.setdefault(name, []).append(FormPart(name, value.encode("latin-1"), None))
        return fields
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise bad_request(
            f"the body must be multipart/form-data with a boundary, got Content-Type "
            f"{content_type!r}",
            None,
        )
    # Each delimiter is preceded by CRLF, which belongs to it (the first one's may be absent).
    sections = (b"\r\n" + body).split(b"\r\n--" + boundary.encode())
    if len(sections) < 2 or not sections[-1].startswith(b"--"):
        raise bad_request("the multipart body is not closed by its boundary", None)
    fields = {}
    for section in sections[1:-1]:
        head, separator, data = section.partition(b"\r\n\r\n")
        if not separator:
            raise bad_request("a multipart part has no header end", None)
        headers = BytesHeaderParser().parsebytes(head.partition(b"\r\n")[2] + b"\r\n\r\n")
        field = headers.get_param("name", header="content-disposition")
        if headers.get_content_disposition() != "form-data" or not isinstance(field, str):
            raise bad_request("a multipart part has no form-data name", None)
        fields.setdefault(field, []).append(FormPart(field, data, headers.get_filename()))
    return fields
