// The QML module `import ImSdk`: registers the SDK's public classes for QML
// without making Qt Qml a dependency of libimsdk (foreign registrations; the
// C++ classes carry no QML macros). See docs/sdk.md, "QML".
#pragma once

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>
#include <im/presencewatch.h>
#include <im/searchmodel.h>
#include <im/types.h>

#include <QtQml/qqml.h>

namespace im::qml {

/// `Client { }`: an im::Client owned by the QML scene.
struct ClientForeign {
    Q_GADGET
    QML_FOREIGN(im::Client)
    QML_NAMED_ELEMENT(Client)
};

/// `ConversationListModel { client: ... }`
struct ConversationListModelForeign {
    Q_GADGET
    QML_FOREIGN(im::ConversationListModel)
    QML_NAMED_ELEMENT(ConversationListModel)
};

/// `MessageListModel { client: ...; conversation: ... }`
struct MessageListModelForeign {
    Q_GADGET
    QML_FOREIGN(im::MessageListModel)
    QML_NAMED_ELEMENT(MessageListModel)
};

/// `OutboxModel { client: ... }`
struct OutboxModelForeign {
    Q_GADGET
    QML_FOREIGN(im::OutboxModel)
    QML_NAMED_ELEMENT(OutboxModel)
};

/// `PresenceWatch { client: ...; users: ["ben"] }`: online / lastSeen to bind
/// (contract section 13, obligation 19).
struct PresenceWatchForeign {
    Q_GADGET
    QML_FOREIGN(im::PresenceWatch)
    QML_NAMED_ELEMENT(PresenceWatch)
};

/// `SearchModel { client: ...; query: field.text }` (obligation 18)
struct SearchModelForeign {
    Q_GADGET
    QML_FOREIGN(im::SearchModel)
    QML_NAMED_ELEMENT(SearchModel)
};

/// `OutboxEntry`: the value type of Client.outbox() entries (read-only).
struct OutboxEntryForeign {
    Q_GADGET
    QML_FOREIGN(im::OutboxEntry)
    QML_NAMED_ELEMENT(outboxEntry)
};

} // namespace im::qml

/// The enums of namespace im by name: `Im.Connected`, `Im.MessageState.Sent`,
/// `Im.Error.NotMember` (the namespace is not creatable).
namespace ImForeign {
Q_NAMESPACE
QML_FOREIGN_NAMESPACE(im)
QML_NAMED_ELEMENT(Im)
} // namespace ImForeign
