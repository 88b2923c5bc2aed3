// Online dots and last seen (contract section 13, obligation 19) in the
// conversation panel: the peers of the direct conversations, and any user
// id QA types into "Watch user", through one im::PresenceWatch.
#pragma once

#include <QtWidgets/QWidget>

namespace im {
class Client;
class ConversationListModel;
class PresenceWatch;
} // namespace im

class QLineEdit;
class QListWidget;

class PresenceList : public QWidget {
    Q_OBJECT
public:
    /// Item data of each row of the list ("presenceList").
    enum ItemRole { UserRole = Qt::UserRole + 1, OnlineRole, KnownRole };

    explicit PresenceList(im::ConversationListModel *convs, QWidget *parent = nullptr);

    /// The users watched: direct peers, then the added ones, no duplicates.
    QStringList users() const;
    /// Watches `user` too (what "Watch user" does).
    void addUser(const QString &user);
    /// "online", "last seen 14:02 (3 min ago)", "last seen: never",
    /// "unknown (no shared conversation?)".
    static QString statusText(bool known, bool online, const QDateTime &lastSeen);

    /// The peer of a direct conversation named after its two members
    /// ("ana-ben" for ana: "ben"); empty if the id does not read so.
    static QString directPeer(const QString &conv, const QString &me);

private:
    void updateUsers();
    void updateRows();

    im::ConversationListModel *convs_;
    im::PresenceWatch *watch_ = nullptr;
    QStringList added_;
    QListWidget *list_;
    QLineEdit *addEdit_;
};
