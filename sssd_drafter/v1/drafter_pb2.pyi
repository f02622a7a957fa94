from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_STATUS_UNSPECIFIED: _ClassVar[DraftStatus]
    DRAFT_STATUS_OK: _ClassVar[DraftStatus]
    DRAFT_STATUS_RESYNC: _ClassVar[DraftStatus]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_FINISHED: _ClassVar[FinishReason]
    FINISH_REASON_ABORTED: _ClassVar[FinishReason]
DRAFT_STATUS_UNSPECIFIED: DraftStatus
DRAFT_STATUS_OK: DraftStatus
DRAFT_STATUS_RESYNC: DraftStatus
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_FINISHED: FinishReason
FINISH_REASON_ABORTED: FinishReason

class DraftRequest(_message.Message):
    __slots__ = ("requests", "step", "tokenizer_fingerprint", "packed")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RequestDelta]
    step: int
    tokenizer_fingerprint: str
    packed: PackedDeltas
    def __init__(self, requests: _Optional[_Iterable[_Union[RequestDelta, _Mapping]]] = ..., step: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., packed: _Optional[_Union[PackedDeltas, _Mapping]] = ...) -> None: ...

class PackedDeltas(_message.Message):
    __slots__ = ("request_ids", "known_lengths", "new_token_counts", "new_tokens", "budgets", "prompt_lengths", "datastores", "do_not_store")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DATASTORES_FIELD_NUMBER: _ClassVar[int]
    DO_NOT_STORE_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    known_lengths: bytes
    new_token_counts: bytes
    new_tokens: bytes
    budgets: bytes
    prompt_lengths: bytes
    datastores: _containers.RepeatedScalarFieldContainer[str]
    do_not_store: bytes
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., known_lengths: _Optional[bytes] = ..., new_token_counts: _Optional[bytes] = ..., new_tokens: _Optional[bytes] = ..., budgets: _Optional[bytes] = ..., prompt_lengths: _Optional[bytes] = ..., datastores: _Optional[_Iterable[str]] = ..., do_not_store: _Optional[bytes] = ...) -> None: ...

class RequestDelta(_message.Message):
    __slots__ = ("request_id", "known_length", "new_tokens", "budget", "datastore", "prompt_length", "do_not_store")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    DATASTORE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DO_NOT_STORE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    known_length: int
    new_tokens: _containers.RepeatedScalarFieldContainer[int]
    budget: int
    datastore: str
    prompt_length: int
    do_not_store: bool
    def __init__(self, request_id: _Optional[str] = ..., known_length: _Optional[int] = ..., new_tokens: _Optional[_Iterable[int]] = ..., budget: _Optional[int] = ..., datastore: _Optional[str] = ..., prompt_length: _Optional[int] = ..., do_not_store: _Optional[bool] = ...) -> None: ...

class DraftResponse(_message.Message):
    __slots__ = ("drafts", "step", "packed")
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    drafts: _containers.RepeatedCompositeFieldContainer[RequestDraft]
    step: int
    packed: PackedDrafts
    def __init__(self, drafts: _Optional[_Iterable[_Union[RequestDraft, _Mapping]]] = ..., step: _Optional[int] = ..., packed: _Optional[_Union[PackedDrafts, _Mapping]] = ...) -> None: ...

class PackedDrafts(_message.Message):
    __slots__ = ("statuses", "lengths", "node_counts", "tokens", "parents", "scores")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    statuses: bytes
    lengths: bytes
    node_counts: bytes
    tokens: bytes
    parents: bytes
    scores: bytes
    def __init__(self, statuses: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., node_counts: _Optional[bytes] = ..., tokens: _Optional[bytes] = ..., parents: _Optional[bytes] = ..., scores: _Optional[bytes] = ...) -> None: ...

class RequestDraft(_message.Message):
    __slots__ = ("request_id", "status", "tokens", "parents", "scores", "length")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: DraftStatus
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    length: int
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[DraftStatus, str]] = ..., tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., scores: _Optional[_Iterable[float]] = ..., length: _Optional[int] = ...) -> None: ...

class FinishRequest(_message.Message):
    __slots__ = ("requests", "wait_durable")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_DURABLE_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[FinishedRequest]
    wait_durable: bool
    def __init__(self, requests: _Optional[_Iterable[_Union[FinishedRequest, _Mapping]]] = ..., wait_durable: _Optional[bool] = ...) -> None: ...

class FinishedRequest(_message.Message):
    __slots__ = ("request_id", "reason", "do_not_store", "final_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DO_NOT_STORE_FIELD_NUMBER: _ClassVar[int]
    FINAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: FinishReason
    do_not_store: bool
    final_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[_Union[FinishReason, str]] = ..., do_not_store: _Optional[bool] = ..., final_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class FinishResponse(_message.Message):
    __slots__ = ("ingested", "unknown_request_ids", "durable")
    INGESTED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    ingested: int
    unknown_request_ids: _containers.RepeatedScalarFieldContainer[str]
    durable: int
    def __init__(self, ingested: _Optional[int] = ..., unknown_request_ids: _Optional[_Iterable[str]] = ..., durable: _Optional[int] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("datastore", "sequences")
    DATASTORE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    datastore: str
    sequences: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    def __init__(self, datastore: _Optional[str] = ..., sequences: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ...) -> None: ...

class TokenSequence(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("accepted", "wal_position")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    WAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    wal_position: int
    def __init__(self, accepted: _Optional[int] = ..., wal_position: _Optional[int] = ...) -> None: ...

class GetServiceInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServiceInfoResponse(_message.Message):
    __slots__ = ("version", "tokenizer", "datastores", "limits")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    DATASTORES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    version: str
    tokenizer: TokenizerInfo
    datastores: _containers.RepeatedCompositeFieldContainer[DatastoreInfo]
    limits: Limits
    def __init__(self, version: _Optional[str] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., datastores: _Optional[_Iterable[_Union[DatastoreInfo, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("name", "fingerprint", "vocab_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: str
    vocab_size: int
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class DatastoreInfo(_message.Message):
    __slots__ = ("name", "is_default", "num_tokens", "sub_indices", "resident_bytes", "live")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUB_INDICES_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    is_default: bool
    num_tokens: int
    sub_indices: int
    resident_bytes: int
    live: bool
    def __init__(self, name: _Optional[str] = ..., is_default: _Optional[bool] = ..., num_tokens: _Optional[int] = ..., sub_indices: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., live: _Optional[bool] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_requests_per_call", "max_tokens_per_request", "max_budget", "max_message_bytes", "max_request_id_chars")
    MAX_REQUESTS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_ID_CHARS_FIELD_NUMBER: _ClassVar[int]
    max_requests_per_call: int
    max_tokens_per_request: int
    max_budget: int
    max_message_bytes: int
    max_request_id_chars: int
    def __init__(self, max_requests_per_call: _Optional[int] = ..., max_tokens_per_request: _Optional[int] = ..., max_budget: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_request_id_chars: _Optional[int] = ...) -> None: ...
