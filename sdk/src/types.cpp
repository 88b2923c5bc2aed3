// Registers the public value types with the meta-type system; error codes.
#include <im/types.h>

#include "outboxentry_p.h"
#include "searchresult_p.h"

#include <QtCore/QHash>

namespace {
const int outboxEntryTypeId = qRegisterMetaType<im::OutboxEntry>();
const int searchResultTypeId = qRegisterMetaType<im::SearchResult>();
const int textRangeTypeId = qRegisterMetaType<im::TextRange>();
} // namespace

namespace im {

// OutboxEntry: a value over its private part (outboxentry_p.h).
OutboxEntry::OutboxEntry() : d(new OutboxEntryData) {}
OutboxEntry::OutboxEntry(OutboxEntryData *data) : d(data) {}
OutboxEntry::OutboxEntry(const OutboxEntry &other) = default;
OutboxEntry::OutboxEntry(OutboxEntry &&other) noexcept = default;
OutboxEntry &OutboxEntry::operator=(const OutboxEntry &other) = default;
OutboxEntry &OutboxEntry::operator=(OutboxEntry &&other) noexcept = default;
OutboxEntry::~OutboxEntry() = default;
QString OutboxEntry::cmid() const { return d->cmid; }
QString OutboxEntry::conv() const { return d->conv; }
QString OutboxEntry::kind() const { return d->kind; }
QString OutboxEntry::body() const { return d->body; }
qint64 OutboxEntry::target() const { return d->target; }
qint64 OutboxEntry::replyTo() const { return d->replyTo; }
QString OutboxEntry::emoji() const { return d->emoji; }
bool OutboxEntry::isOn() const { return d->on; }
QString OutboxEntry::targetCmid() const { return d->targetCmid; }
int OutboxEntry::attempts() const { return d->attempts; }
QString OutboxEntry::lastError() const { return d->lastError; }
QDateTime OutboxEntry::nextRetryAt() const { return d->nextRetryAt; }
QDateTime OutboxEntry::createdAt() const { return d->createdAt; }
bool OutboxEntry::isInFlight() const { return d->inFlight; }
QString OutboxEntry::prev() const { return d->prev; }
bool OutboxEntry::isHeld() const { return d->held; }

Error errorFromCode(const QString &code) {
    static const QHash<QString, Error> codes{
        {QStringLiteral("INVALID_ARGUMENT"), Error::InvalidArgument},
        {QStringLiteral("UNAUTHENTICATED"), Error::Unauthenticated},
        {QStringLiteral("NOT_MEMBER"), Error::NotMember},
        {QStringLiteral("NOT_FOUND"), Error::NotFound},
        {QStringLiteral("NOT_SENDER"), Error::NotSender},
        {QStringLiteral("ALREADY_RECALLED"), Error::AlreadyRecalled},
        {QStringLiteral("RECALL_WINDOW_EXPIRED"), Error::RecallWindowExpired},
        {QStringLiteral("IDEMPOTENCY_MISMATCH"), Error::IdempotencyMismatch},
        {QStringLiteral("ORIGINAL_EXPIRED"), Error::OriginalExpired},
        {QStringLiteral("STALE_INSTALL"), Error::StaleInstall},
        {QStringLiteral("UNAVAILABLE"), Error::Unavailable},
        {QStringLiteral("EPOCH_CHANGED"), Error::EpochChanged},
        {QStringLiteral("CURSOR_AHEAD"), Error::CursorAhead},
        {QStringLiteral("PROTOCOL_ERROR"), Error::ProtocolError},
        {QStringLiteral("STORAGE_ERROR"), Error::StorageError},
        {QStringLiteral("STORE_LOCKED"), Error::StoreLocked},
        {QStringLiteral("WRONG_USER"), Error::WrongUser},
        {QStringLiteral("TLS_ERROR"), Error::TlsError},
        {QStringLiteral("DRAFTS_HELD"), Error::DraftsHeld},
        {QStringLiteral("RATE_LIMITED"), Error::RateLimited},
        {QStringLiteral("MUTED"), Error::Muted},
        {QStringLiteral("TOO_LARGE"), Error::TooLarge},
        {QStringLiteral("DIGEST_MISMATCH"), Error::DigestMismatch},
    };
    if (code.isEmpty())
        return Error::None;
    return codes.value(code, Error::Unknown);
}

// SearchResult: a value over its private part (searchresult_p.h).
SearchResult::SearchResult() : d(new SearchResultData) {}
SearchResult::SearchResult(const SearchResult &other) = default;
SearchResult::SearchResult(SearchResult &&other) noexcept = default;
SearchResult &SearchResult::operator=(const SearchResult &other) = default;
SearchResult &SearchResult::operator=(SearchResult &&other) noexcept = default;
SearchResult::~SearchResult() = default;
QString SearchResult::conv() const { return d->conv; }
qint64 SearchResult::seq() const { return d->seq; }
QString SearchResult::sender() const { return d->sender; }
qint64 SearchResult::ts() const { return d->ts; }
QString SearchResult::body() const { return d->body; }
QList<TextRange> SearchResult::matches() const { return d->matches; }
QString SearchResult::snippet() const { return d->snippet; }
QList<TextRange> SearchResult::snippetMatches() const { return d->snippetMatches; }
qint64 SearchResult::position() const { return d->position; }

} // namespace im
