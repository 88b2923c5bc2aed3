// The search box of a chat window (obligation 18, im::SearchModel): what the
// user types searches every stored message (or only the shown
// conversation's), newest first, the matches in bold; activating a result
// shows that message in its conversation. A notice says when some
// conversations could not be searched completely (history not loaded
// here), with a button that loads more of it; the results follow.
#pragma once

#include <QtWidgets/QGroupBox>

namespace im {
class Client;
class SearchModel;
} // namespace im

class QCheckBox;
class QLabel;
class QLineEdit;
class QListView;
class QPushButton;

class SearchPanel : public QGroupBox {
    Q_OBJECT
public:
    explicit SearchPanel(im::Client *client, QWidget *parent = nullptr);

    im::SearchModel *model() const { return model_; }
    /// The conversation "this conversation only" searches.
    void setCurrentConversation(const QString &conv);
    /// The snippet of result `row` as the view shows it (HTML, matches in <b>).
    QString snippetHtml(int row) const;
    /// The notice's text (empty when everything could be searched).
    QString noticeText() const;

Q_SIGNALS:
    /// The user activated a result: show message `seq` of `conv`.
    void resultActivated(const QString &conv, qint64 seq);

private:
    void updateScope();
    void updateNotice();

    im::SearchModel *model_;
    QString currentConv_;
    QLineEdit *box_;
    QCheckBox *thisConvOnly_;
    QListView *results_;
    QLabel *status_;
    QLabel *notice_;
    QPushButton *loadButton_;
};
