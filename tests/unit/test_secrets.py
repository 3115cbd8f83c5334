"""Secrets are never shown: a recognizable secret planted in every setting and file that can
hold one reaches no error message, traceback, repr or log line (the processes themselves are
checked in tests/integration/test_secrets.py)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from blackbox.api.access import Access
from blackbox.api.backend import _api_signer
from blackbox.api.tokens import digest, tokens_of
from blackbox.errors import SettingsError
from blackbox.settings import VARIABLES, Settings
from blackbox.storage.connections import redis_client

PLANTED = "PLANTED-s3cr3t-9f2c"  # recognizable in any output, a valid password anywhere
# Every librdkafka property that holds a credential, as each kind of client is given it.
KAFKA_SECRETS = (
    "SASL_PASSWORD",
    "SSL_KEY_PASSWORD",
    "SSL_KEYSTORE_PASSWORD",
    "SSL_KEY_PEM",
    "SASL_OAUTHBEARER_CLIENT_SECRET",
    "SASL_OAUTHBEARER_CONFIG",
    "SASL_OAUTHBEARER_EXTENSIONS",
    "SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PASSPHRASE",
    "SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PEM",
)
# REDIS_URL in each form that carries a password: authority, query options, Sentinels.
REDIS_URLS = (
    f"redis://app:{PLANTED}@cache:6380/1",
    f"rediss://:{PLANTED}@cache:6380/0",
    f"redis://cache:6379/0?password={PLANTED}",
    f"redis+sentinel://:{PLANTED}@s1:26379,s2:26379/mymaster/0?sentinel_password={PLANTED}",
    f"redis+cluster://app:{PLANTED}@node:7000",
)
# REDIS_URLs that are refused, each holding the secret.
BAD_REDIS_URLS = (
    f"redis://app:{PLANTED}@cache:notaport/0",
    f"redis://app:{PLANTED}#x@cache:6379/0",  # an unencoded '#' in the password
    f"redis+sentinel://:{PLANTED}@s1:26379/mymaster/notadb",
    f"redis+cluster://app:{PLANTED}@node:7000/3",
    f"nosuch://app:{PLANTED}@cache:6379/0",
)


def _everything(error: BaseException) -> str:
    """All an operator could see of an error: its text and its traceback with every cause."""
    return "".join(traceback.format_exception(error))


def _kafka_environment() -> dict[str, str]:
    prefixes = ("KAFKA_", "KAFKA_CONSUMER_", "KAFKA_PRODUCER_")
    return {prefix + name: PLANTED for prefix in prefixes for name in KAFKA_SECRETS}


def test_the_api_token_is_not_echoed_when_refused() -> None:
    """A token refused for its length is named, never printed: the error once quoted it."""
    with pytest.raises(SettingsError, match="BLACKBOX_API_TOKEN") as refused:
        Settings.from_env({"BLACKBOX_API_TOKEN": PLANTED[:12]})
    assert PLANTED[:12] not in _everything(refused.value)


@pytest.mark.parametrize("var", [v for v in VARIABLES if v.secret], ids=lambda v: v.name)
def test_every_secret_variable_is_masked_in_repr(var: object) -> None:
    """Each variable marked secret is masked in the settings' repr (the service logs it)."""
    name = getattr(var, "name", "")
    value = f"redis://:{PLANTED}@cache:6379/0" if name == "REDIS_URL" else PLANTED
    loaded = Settings.from_env({name: value})
    assert PLANTED not in repr(loaded)
    assert getattr(loaded, getattr(var, "attribute", "")) == value  # kept for the clients


def test_the_secret_variables_are_the_ones_holding_secrets() -> None:
    """The token and the Redis URL are marked secret; paths and names are not (a path to a
    secret file is shown, so an operator can tell which file failed)."""
    secret = {v.name for v in VARIABLES if v.secret}
    assert secret == {"REDIS_URL", "BLACKBOX_API_TOKEN"}


@pytest.mark.parametrize("url", REDIS_URLS)
def test_redis_urls_are_masked_in_repr(url: str) -> None:
    """A password in a Redis URL (authority, query, Sentinel options) is masked in repr."""
    assert PLANTED not in repr(Settings.from_env({"REDIS_URL": url}))


@pytest.mark.parametrize("url", BAD_REDIS_URLS)
def test_a_refused_redis_url_does_not_show_its_password(url: str) -> None:
    """A malformed REDIS_URL is refused naming the variable, its password masked, in the
    message and in every chained cause."""
    with pytest.raises(SettingsError, match="REDIS_URL") as refused:
        redis_client(url).close()
    assert PLANTED not in _everything(refused.value)


def test_kafka_credentials_are_masked_for_every_client() -> None:
    """Every librdkafka credential, shared or for the consumer or the producers only, is
    masked in repr and kept in the settings the clients are built from."""
    loaded = Settings.from_env(_kafka_environment())
    assert PLANTED not in repr(loaded)
    assert loaded.kafka["sasl.oauthbearer.config"] == PLANTED
    assert loaded.kafka_producer["ssl.key.pem"] == PLANTED


def test_a_malformed_tokens_file_is_refused_without_quoting_it(tmp_path: Path) -> None:
    """YAML quotes the lines around a fault; the tokens file's error says where, never what,
    and chains no cause that would print them with a traceback."""
    hashed = digest(PLANTED)
    path = tmp_path / "tokens.yaml"
    path.write_text(f'tokens:\n  - name: ops\n    sha256: "{hashed}\n    callers: [a]\n')
    with pytest.raises(SettingsError, match="line 5") as refused:
        tokens_of("", str(path))
    assert hashed[:16] not in _everything(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        '{{"tokens": [{{"sha256": "{h}" "callers": ["a"]}}]}}',  # JSON: a comma missing
        '{{"tokens": [{{"sha256": "{h}", "callers": "a"}}]}}',  # callers not a list
        '{{"tokens": [{{"sha256": "{h}x", "callers": ["a"]}}]}}',  # not 64 hex digits
        '{{"tokens": [{{"sha256": "{h}", "callers": ["a"], "colour": 1}}]}}',  # unknown field
    ],
)
def test_a_refused_tokens_entry_does_not_show_its_hash(tmp_path: Path, text: str) -> None:
    """Each way a tokens file is refused names the entry, not the token hash it holds."""
    hashed = digest(PLANTED)
    path = tmp_path / "tokens.json"
    path.write_text(text.format(h=hashed))
    with pytest.raises(SettingsError) as refused:
        tokens_of("", str(path))
    assert hashed[:16] not in _everything(refused.value)


def test_tokens_and_access_hide_tokens_and_hashes_in_repr(tmp_path: Path) -> None:
    """The API's access rules show the names of tokens, never a token or its hash."""
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - name: ops\n    sha256: {digest(PLANTED + 'x')}\n"
                    "    callers: [a]\n")  # fmt: skip
    tokens = tokens_of(PLANTED, str(path))
    shown = repr(Access(PLANTED, False, False, (), tokens)) + repr(tokens)
    assert PLANTED not in shown
    assert digest(PLANTED) not in shown and digest(PLANTED + "x") not in shown
    assert "ops" in shown


def test_a_malformed_signing_key_is_refused_without_quoting_it(tmp_path: Path) -> None:
    """BLACKBOX_API_SIGNING_KEY_FILE holding no key: refused naming the variable, with
    nothing of the file's text."""
    path = tmp_path / "key.pem"
    path.write_text(f"-----BEGIN PRIVATE KEY-----\n{PLANTED}\n-----END PRIVATE KEY-----\n")
    settings = Settings.from_env({"BLACKBOX_API_SIGNING_KEY_FILE": str(path)})
    with pytest.raises(SettingsError, match="BLACKBOX_API_SIGNING_KEY_FILE") as refused:
        _api_signer(settings)
    assert PLANTED not in _everything(refused.value)
