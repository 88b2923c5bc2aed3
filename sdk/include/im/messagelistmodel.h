// im::MessageListModel: the timeline of one conversation, from the local database.
#pragma once

#include <im/global.h>
#include <im/types.h>

#include <QtCore/QAbstractListModel>
#include <QtCore/QPointer>

#include <memory>

namespace im {

class Client;
class MessageListModelPrivate;

/**
 * The messages of one conversation as a list model, oldest first: events
 * applied from the server (by seq) followed by our own messages not yet
 * confirmed (Pending / Failed / Expired, in creation order). Updated live as
 * the Client applies pages, pushes and replies. Recall events are not rows:
 * the recalled message shows state Recalled.
 */
class IM_SDK_EXPORT MessageListModel : public QAbstractListModel {
    Q_OBJECT
    Q_PROPERTY(QString conversation READ conversation WRITE setConversation NOTIFY conversationChanged)
    Q_PROPERTY(int count READ count NOTIFY countChanged)
public:
    enum Roles {
        BodyRole = Qt::UserRole + 1, ///< QString message text (also Qt::DisplayRole)
        SenderRole,     ///< QString user id of the sender
        SeqRole,        ///< qint64 seq, 0 while not known
        StateRole,      ///< int im::MessageState
        ErrorCodeRole,  ///< QString error code of a Failed / Expired message
        CmidRole,       ///< QString cmid of our own messages (empty for others')
        TimestampRole,  ///< QDateTime commit time (creation time while pending)
        KindRole,       ///< QString "msg", "join" or "leave"
        DupRole,        ///< bool: the send reply said dup:true (a resend hit the original)
        IsOwnRole,      ///< bool: sent by this user
        UserRole,       ///< QString the user who joined / left (join/leave)
    };
    Q_ENUM(Roles)

    explicit MessageListModel(Client *client, const QString &conversation = {}, QObject *parent = nullptr);
    ~MessageListModel() override;

    QString conversation() const;
    void setConversation(const QString &conv);
    int count() const;

    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;

    /// Value of `role` at `row` (convenience for tests and scripts).
    Q_INVOKABLE QVariant get(int row, int role) const;

public Q_SLOTS:
    /// Re-reads the database now (normally done automatically).
    void refresh();

Q_SIGNALS:
    void conversationChanged();
    void countChanged();

private:
    std::unique_ptr<MessageListModelPrivate> d;
};

} // namespace im
