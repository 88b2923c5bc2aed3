// Registers the public value types with the meta-type system; error codes.
#include <im/types.h>

#include <QtCore/QHash>

namespace {
const int outboxEntryTypeId = qRegisterMetaType<im::OutboxEntry>();
} // namespace

namespace im {

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
    };
    if (code.isEmpty())
        return Error::None;
    return codes.value(code, Error::Unknown);
}

} // namespace im
