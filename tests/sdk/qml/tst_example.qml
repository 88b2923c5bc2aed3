// The QML example (examples/qml-chat/ChatView.qml) driven like a user
// against the real server: pick a user of the demo token file, sign in, click
// a conversation, type, click Send, see the message Sent with its seq.
import QtQuick
import QtTest
import ImSdk

// TestCase itself is not visible: the example lives in this item.
Item {
    id: window
    width: 800
    height: 560

    TestCase {
        id: test
        name: "QmlChatExample"
        when: windowShown

        property var view: null

        function initTestCase() {
            verify(setupError === "", setupError)
            const component = Qt.createComponent(exampleDir + "/ChatView.qml")
            verify(component.status === Component.Ready, component.errorString())
            const users = Object.keys(tokens).map(u => ({user: u, device: u + "-d1", token: tokens[u]}))
            view = component.createObject(window, {width: 800, height: 560, serverUrl: serverUrl.toString(),
                                                 users: users, user: "ben", dataDir: dataDir})
            verify(view !== null)
        }

        function test_signInAndSend() {
            verify(!view.signedIn)
            mouseClick(findChild(view, "signInButton"))
            verify(view.signedIn, view.status)
            tryCompare(view.client, "connectionState", Im.Connected, 120000)
            compare(view.client.userId, "ben")

            // Click the "team" row of the conversation list.
            const list = findChild(view, "conversationList")
            tryVerify(() => view.conversations.indexOf("team") >= 0, 120000, "team never listed")
            const row = view.conversations.indexOf("team")
            list.positionViewAtIndex(row, ListView.Contain)
            tryVerify(() => list.itemAtIndex(row) !== null)
            mouseClick(list.itemAtIndex(row))
            compare(view.messages.conversation, "team")

            const input = findChild(view, "input")
            input.text = "typed in qmlchat"
            mouseClick(findChild(view, "sendButton"))
            compare(input.text, "", view.status)

            const messages = view.messages
            function sentRow() {
                for (let r = messages.count - 1; r >= 0; --r) {
                    const m = messages.get(r)
                    if (m.body === "typed in qmlchat" && m.isOwn)
                        return m.messageState === Im.Sent && m.seq > 0 ? r : -2
                }
                return -1
            }
            tryVerify(() => sentRow() >= 0, 120000, "the typed message never became Sent")
            const m = messages.get(sentRow())
            compare(m.sender, "ben")
            // The message list shows it without the "sending" mark.
            const shown = findChild(view, "messageList")
            shown.positionViewAtIndex(sentRow(), ListView.Contain)
            tryVerify(() => shown.itemAtIndex(sentRow()) !== null)
            compare(shown.itemAtIndex(sentRow()).text, "ben: typed in qmlchat")
        }

        // The model's window while the list is at the newest message (one
        // message after another, each settled), after a scroll to the
        // oldest end (the list's own fetchMore(): the rows stay), and back
        // at the newest, where the next message shrinks the window again.
        function test_windowStaysAtItsSizeAtTheNewestAndShrinksBackAfterAScroll() {
            if (!view.signedIn) {
                mouseClick(findChild(view, "signInButton"))
                tryCompare(view.client, "connectionState", Im.Connected, 120000)
            }
            tryVerify(() => view.conversations.indexOf("team") >= 0, 120000, "team never listed")
            view.messages.conversation = "team"
            const messages = view.messages
            const list = findChild(view, "messageList")
            // More rows than the list shows with its cache buffer (560 px
            // and 320 px): fewer, and the list would pull older rows at the
            // newest message (docs/sdk.md, "Windows that stay small").
            messages.windowRows = 100
            let most = 0
            for (let i = 1; i <= 230; ++i) {
                verify(view.client.send("team", "window " + i) !== "", view.client.lastError())
                tryCompare(view.client, "pendingCount", 0, 120000)
                most = Math.max(most, messages.count)
            }
            tryVerify(() => messages.get(0).body === "window 230" && messages.get(0).messageState === Im.Sent, 120000)
            tryCompare(messages, "count", 100)
            verify(messages.followingNewest)
            verify(list.atYEnd)
            // Bounded: the DelegateModel's own fetchMore() adds at most one
            // window before the next change of rows shrinks it again.
            verify(most <= 2 * 100 + 1, "the window grew to " + most + " rows")

            list.positionViewAtEnd() // the top: the oldest row
            tryVerify(() => messages.count > 100, 120000, "the list loaded nothing older")
            verify(!messages.followingNewest)
            const held = messages.count
            list.positionViewAtBeginning() // back at the newest, and a message
            tryVerify(() => list.atYEnd)
            verify(!messages.followingNewest)
            compare(messages.count, held)
            verify(view.client.send("team", "window 231") !== "", view.client.lastError())
            tryCompare(messages, "followingNewest", true)
            tryCompare(messages, "count", 100)
            compare(messages.get(0).body, "window 231")
        }

        function cleanupTestCase() {
            if (view) {
                view.client.disconnectFromServer()
                view.client.close()
            }
        }
    }
}
